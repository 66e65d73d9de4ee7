// bertserve's native gRPC transport: gRPC's C++ callback server takes unary calls of the methods named at
// start and hands them to Python in groups (service/grpc/native/transport.py loads this library with
// ctypes), which answers each call with its reply's bytes or a status. Python's cost is per group of calls,
// not per call; the per-call work (HTTP/2, the call's life, its deadline and cancellation) stays here. Calls
// of other methods are relayed to the front's grpc.aio server (relay.h), or get UNIMPLEMENTED without one.
//
// Python learns of new calls, and of taken calls that ended without its answer, from an eventfd (its event
// loop watches it): written when one comes and nobody was told since a take (or a read of the ended calls)
// left nothing, and again after a take or read that leaves some (Rearm).
//
// Bounds: at most `max_open` calls open (kMaxStreamsPerConnection on one connection), requests of at most
// `max_message_bytes` (gRPC refuses larger ones), each within `read_timeout_s` of the call's start (else
// DEADLINE_EXCEEDED); once a request is read, at most `max_calls` calls held (queued, with Python or being
// answered) and `max_request_bytes` of their requests (a lone call always fits), else RESOURCE_EXHAUSTED.
// Health checks are not counted against max_open, max_calls or the request bytes, nor refused while
// draining (the health service answers NOT_SERVING then), as on the main port: at most kMaxProbesOpen of
// them open, each request at most kMaxProbeBytes.
// A request is kept here until Python takes it and freed with its call. After bsn_drain, new calls get
// UNAVAILABLE; bsn_stop ends the rest.
//
// One translation unit in parts, included below in this order (each uses those before it): relay.h (relayed
// calls), call.h (the call objects), transport.h (the calls held, the queue Python takes from), reactor.h
// (gRPC's side of a call); this file keeps the C API Python calls.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/security/server_credentials.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "relay.h"
#include "call.h"
#include "transport.h"
#include "reactor.h"

namespace {

// HTTP/2 streams one connection may have open at once (gRPC's default is unlimited).
constexpr int kMaxStreamsPerConnection = 256;
// The least memory gRPC's buffers get (below a few MiB it stalls calls of ordinary size).
constexpr int64_t kMinQuotaBytes = 16 << 20;

struct Handle {
  std::unique_ptr<Transport> transport;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

void CopyError(const std::string& message, char* error, int size) {
  if (size <= 0) return;
  std::strncpy(error, message.c_str(), size - 1);
  error[size - 1] = '\0';
}

}  // namespace

extern "C" {

// `methods`: NUL-separated full method names ("/package.Service/Method"), `methods_size` bytes in all; a
// call's method is its index there; the last `probes` are health checks, answered while draining and
// beside full limits (at most kMaxProbesOpen open). PEM strings empty: no TLS; `client_ca` set: clients
// must present a certificate it signed. `reuse_port`: join the bound sockets of the server's other fronts
// (its supervisor holds the port); else a taken port fails. `relay`: the address of the front's own gRPC
// server that calls of other methods are relayed to ("": they get UNIMPLEMENTED). Returns NULL with
// `error` filled when the port cannot be had.
void* bsn_start(const char* address, const char* methods, int methods_size, int probes, int max_calls,
                int64_t max_request_bytes, int max_message_bytes, int max_open, double read_timeout_s,
                int reuse_port, const char* cert, const char* key, const char* client_ca, const char* relay,
                char* error, int error_size) {
  std::vector<std::string> names;
  for (int start = 0; start < methods_size;) {
    std::string name(methods + start);
    start += static_cast<int>(name.size()) + 1;
    names.push_back(name);
  }
  auto handle = std::make_unique<Handle>();
  std::unique_ptr<grpc::GenericStub> stub;
  if (relay[0] != '\0') {
    grpc::ChannelArguments arguments;
    arguments.SetMaxReceiveMessageSize(max_message_bytes);
    arguments.SetMaxSendMessageSize(max_message_bytes);
    arguments.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);  // a stream nobody reads holds its 64 KiB window, no more
    stub = std::make_unique<grpc::GenericStub>(
        grpc::CreateCustomChannel(relay, grpc::InsecureChannelCredentials(), arguments));
  }
  handle->transport = std::make_unique<Transport>(names, probes, max_calls, max_request_bytes, max_open,
                                                  read_timeout_s, std::move(stub));
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  if (cert[0] != '\0') {
    grpc::SslServerCredentialsOptions options(client_ca[0] != '\0'
                                                  ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                                  : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
    options.pem_root_certs = client_ca;
    options.pem_key_cert_pairs.push_back({key, cert});
    credentials = grpc::SslServerCredentials(options);
  }
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, credentials, &handle->port);
  builder.SetMaxReceiveMessageSize(max_message_bytes);
  builder.SetMaxSendMessageSize(max_message_bytes);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, std::min(max_open, kMaxStreamsPerConnection));
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, reuse_port);
  // gRPC's own buffers (requests being received, replies being sent): under pressure it shrinks the
  // flow-control windows, so clients that send or read slowly cannot make it hold more. Relayed messages
  // wait in these buffers too: they get a share of their own (their budget), so they cannot starve requests.
  grpc::ResourceQuota quota("bertserve-native");
  int64_t relayed = relay[0] != '\0' ? max_request_bytes + max_message_bytes : 0;
  quota.Resize(static_cast<size_t>(std::max<int64_t>(max_request_bytes + max_message_bytes, kMinQuotaBytes) + relayed));
  builder.SetResourceQuota(quota);
  builder.RegisterCallbackGenericService(handle->transport.get());
  handle->server = builder.BuildAndStart();
  if (!handle->server || handle->port == 0) {
    CopyError(std::string("cannot listen on ") + address, error, error_size);
    return nullptr;
  }
  return handle.release();
}

int bsn_port(void* handle) { return static_cast<Handle*>(handle)->port; }

// The eventfd that becomes readable when calls wait to be taken (read it, then take until none is left).
int bsn_wakeup_fd(void* handle) { return static_cast<Handle*>(handle)->transport->wakeup(); }

// Takes up to `max_calls` waiting calls, without blocking (read the eventfd first, then take until none
// is left). Each taken call is [u64 id][f64 seconds to its deadline, -1: none][i32 method][u32 size][request].
// Returns how many were taken (their records at *data, *size bytes, valid until the next bsn_next), 0 when
// none waits, -1 once the transport is closed and nothing is queued.
int bsn_next(void* handle, int max_calls, const char** data, int64_t* size) {
  Transport* transport = static_cast<Handle*>(handle)->transport.get();
  int taken = transport->Next(max_calls);
  *data = transport->batch().data();
  *size = static_cast<int64_t>(transport->batch().size());
  return taken;
}

// Answers call `id` with `size` bytes of reply; returns 0 when the call had ended already (cancelled, or
// the grace period was over).
int bsn_reply(void* handle, uint64_t id, const char* data, int64_t size) {
  Call* call = static_cast<Handle*>(handle)->transport->Take(id);
  if (call == nullptr) return 0;
  call->Reply(reinterpret_cast<const uint8_t*>(data), static_cast<size_t>(size));
  return 1;
}

// Ends call `id` with gRPC status `code` and `message`; 0 when it had ended already.
int bsn_fail(void* handle, uint64_t id, int code, const char* message) {
  Call* call = static_cast<Handle*>(handle)->transport->Take(id);
  if (call == nullptr) return 0;
  call->End(grpc::Status(static_cast<grpc::StatusCode>(code), message));
  return 1;
}

int bsn_held(void* handle) { return static_cast<Handle*>(handle)->transport->held(); }

// Calls not yet ended, their request read or still arriving; health checks aside.
int bsn_open(void* handle) { return static_cast<Handle*>(handle)->transport->open(); }

// Relayed calls not yet done and the bytes of client messages they hold, into out[0] and out[1].
void bsn_relays(void* handle, int64_t* out) { static_cast<Handle*>(handle)->transport->Relays(out); }

// Calls taken that ended without an answer: (id, status code) pairs into `out`, at most `max_pairs`.
int bsn_dropped(void* handle, int64_t* out, int max_pairs) {
  return static_cast<Handle*>(handle)->transport->Dropped(out, max_pairs);
}

// Calls the transport ended itself before Python took them (refusals, timeouts, cancellations), by method
// and gRPC status code: 17 counters per method (in bsn_start's order) since the start into `out`.
void bsn_counts(void* handle, int64_t* out) { static_cast<Handle*>(handle)->transport->Counts(out); }

// New calls get UNAVAILABLE from now on; the held ones are still answered.
void bsn_drain(void* handle) { static_cast<Handle*>(handle)->transport->StartDraining(); }

// Ends what is still held with UNAVAILABLE, stops the server (waiting at most `grace_s` for calls gRPC is
// finishing) and wakes the taker (bsn_next returns -1). Blocks: call it without Python's lock.
void bsn_stop(void* handle, double grace_s) {
  Handle* h = static_cast<Handle*>(handle);
  h->transport->StartDraining();
  h->transport->EndAll(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server stopped"));
  auto deadline = std::chrono::system_clock::now() + std::chrono::duration_cast<std::chrono::system_clock::duration>(
                                                         std::chrono::duration<double>(grace_s));
  h->server->Shutdown(deadline);
  h->transport->Close();
}

// Frees the server; only after bsn_stop and once no thread is in bsn_next.
void bsn_free(void* handle) {
  Handle* h = static_cast<Handle*>(handle);
  h->server->Wait();
  delete h;
}

}  // extern "C"
