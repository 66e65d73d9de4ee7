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
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/security/server_credentials.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "relay.h"

namespace {

class Transport;

// One unary call: created when it arrives, deleted when gRPC is done with it.
class Call : public grpc::ServerGenericBidiReactor {
 public:
  Call(Transport* transport, grpc::CallbackServerContext* context, uint64_t id)
      : transport_(transport), context_(context), id_(id) {}
  void Begin();  // reads the request
  void OnReadDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;
  // Called once, by whoever removed the call from the transport's table.
  void Reply(const uint8_t* data, size_t size) {
    grpc::Slice slice(data, size);
    response_ = grpc::ByteBuffer(&slice, 1);
    StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
  }
  void End(const grpc::Status& status) { Finish(status); }

 private:
  Transport* transport_;
  grpc::CallbackServerContext* context_;
  uint64_t id_;
  grpc::ByteBuffer request_, response_;
};

// A call ended at once (unknown method, no room, draining): never reaches the table.
class Refusal : public grpc::ServerGenericBidiReactor {
 public:
  explicit Refusal(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

using Steady = std::chrono::steady_clock;
constexpr int kMaxProbesOpen = 64;  // health checks open at once (their requests arriving or answered)
constexpr int64_t kMaxProbeBytes = 4096;  // a health check's request (a service name); beyond: refused
using Wall = std::chrono::system_clock;
constexpr int kCodes = 17;  // gRPC status codes

class Transport : public grpc::CallbackGenericService {
 public:
  // `relay`: the stub of the front's grpc.aio server that other methods are relayed to (null: UNIMPLEMENTED).
  // `probes`: how many of `methods`, at their end, are health checks (never refused, see kMaxProbesOpen).
  Transport(std::vector<std::string> methods, int probes, int max_calls, int64_t max_request_bytes, int max_open,
            double read_timeout_s, std::unique_ptr<grpc::GenericStub> relay)
      : methods_(std::move(methods)),
        first_probe_(static_cast<int>(methods_.size()) - probes),
        relay_(std::move(relay)),
        relay_budget_(max_request_bytes),
        max_calls_(max_calls),
        max_request_bytes_(max_request_bytes),
        max_open_(max_open),
        read_timeout_(std::chrono::duration_cast<Steady::duration>(std::chrono::duration<double>(read_timeout_s))),
        wakeup_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)),
        ended_(new std::atomic<int64_t>[methods_.size() * kCodes]()),
        reaper_([this] { Reap(); }) {}
  ~Transport() override {
    Close();
    reaper_.join();
    close(wakeup_);
  }

  int wakeup() const { return wakeup_; }

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* context) override {
    auto found = std::find(methods_.begin(), methods_.end(), context->method());
    if (found == methods_.end() && relay_ != nullptr) return Relayed(context);
    if (found == methods_.end()) {
      return new Refusal(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                                      "method " + context->method() + " is not served on this port"));
    }
    Call* call;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      int method = static_cast<int>(found - methods_.begin());
      bool probe = method >= first_probe_;  // answered while draining (NOT_SERVING) and beside full limits
      if (probe && probes_open_ >= kMaxProbesOpen) {
        Count(method, grpc::StatusCode::RESOURCE_EXHAUSTED);
        return new Refusal(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                        std::to_string(probes_open_) + " health checks are open; retry later"));
      }
      if (draining_ && !probe) {
        Count(method, grpc::StatusCode::UNAVAILABLE);
        return new Refusal(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down"));
      }
      if (!probe && static_cast<int>(table_.size()) - probes_open_ >= max_open_) {
        Count(method, grpc::StatusCode::RESOURCE_EXHAUSTED);
        return new Refusal(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                        std::to_string(table_.size() - probes_open_) +
                                            " calls are open, max_concurrent_rpcs " +
                                            std::to_string(max_open_) + "; retry later"));
      }
      uint64_t id = ++last_id_;
      call = new Call(this, context, id);
      Held held;
      held.call = call;
      held.method_index = method;
      held.probe = probe;
      held.created = Steady::now();
      probes_open_ += probe;
      table_.emplace(id, std::move(held));
    }
    call->Begin();
    return call;
  }

  // A call of another method, relayed (relay.h); refused while draining or when max_open relays are open.
  grpc::ServerGenericBidiReactor* Relayed(grpc::GenericCallbackServerContext* context) {
    std::string invalid = relay::InvalidMetadata(context);
    if (!invalid.empty()) return new Refusal(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, invalid));
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (draining_) return new Refusal(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down"));
      if (relays_ >= max_open_) {
        return new Refusal(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                        std::to_string(relays_) + " streams are open, max_concurrent_rpcs " +
                                            std::to_string(max_open_) + "; retry later"));
      }
      ++relays_;
    }
    return new relay::Relay(relay_.get(), context, &relay_budget_, [this] {
      std::lock_guard<std::mutex> lock(mutex_);
      --relays_;
    });
  }

  // The call's request is read: queued for Python, or why it is refused (RESOURCE_EXHAUSTED).
  std::string Arrived(uint64_t id, Wall::time_point deadline, std::string&& request) {
    bool tell;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto found = table_.find(id);
      if (found == table_.end()) return "";  // ended while its request was read
      int64_t size = static_cast<int64_t>(request.size());
      Held& held = found->second;
      if (held.probe && size > kMaxProbeBytes) {
        return "a health check of " + std::to_string(size) + " bytes; at most " + std::to_string(kMaxProbeBytes);
      }
      if (!held.probe && admitted_ >= max_calls_) {
        return std::to_string(admitted_) + " calls are held, max_queue_inputs " + std::to_string(max_calls_) +
               "; retry later";
      }
      if (!held.probe && bytes_ > 0 && bytes_ + size > max_request_bytes_) {
        return std::to_string(bytes_) + " bytes of requests are held, max_request_bytes_in_flight " +
               std::to_string(max_request_bytes_) + "; retry later";
      }
      held.read = true;
      held.bytes = held.probe ? 0 : size;  // probes: within kMaxProbesOpen x kMaxProbeBytes, not the budget
      held.deadline = deadline;
      held.request = std::move(request);
      bytes_ += held.bytes;
      admitted_ += !held.probe;
      queue_.push_back(id);
      tell = ShouldTell();
    }
    if (tell) Tell();
    return "";
  }

  // The call leaves the table (so exactly one of Python's answer, a cancellation, the reaper or shutdown
  // ends it); its request, if still here, is freed with it. `code`: how this side ends it, counted when
  // Python never took it (Python counts the calls it took: those are told to it, `Dropped`).
  Call* Take(uint64_t id, int code = -1) {
    bool tell = false;
    Call* call;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto found = table_.find(id);
      if (found == table_.end()) return nullptr;
      if (code >= 0 && !found->second.taken) Count(found->second.method_index, static_cast<grpc::StatusCode>(code));
      if (code >= 0 && found->second.taken) {  // Python computes it still: tell it to stop
        dropped_.push_back({id, static_cast<int64_t>(code)});
        tell = ShouldTell();
      }
      call = found->second.call;
      bytes_ -= found->second.bytes;
      probes_open_ -= found->second.probe;
      admitted_ -= found->second.read && !found->second.probe;
      table_.erase(found);
    }
    if (tell) Tell();
    return call;
  }

  // The calls Python took that ended without its answer (cancelled by their client, past their deadline),
  // as (id, status code) pairs into `out` (at most `max_pairs`); returns how many. At most one per call
  // taken, so bounded by the calls held.
  int Dropped(int64_t* out, int max_pairs) {
    int n;
    bool left;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      n = std::min(max_pairs, static_cast<int>(dropped_.size()));
      for (int i = 0; i < n; ++i) {
        out[2 * i] = static_cast<int64_t>(dropped_[i].first);
        out[2 * i + 1] = dropped_[i].second;
      }
      dropped_.erase(dropped_.begin(), dropped_.begin() + n);
      left = Rearm();
    }
    if (left) Tell();
    return n;
  }

  // Takes up to `max_calls` queued calls into `batch_`, without waiting. Returns how many, or -1 once
  // closed and empty.
  int Next(int max_calls) {
    std::unique_lock<std::mutex> lock(mutex_);
    batch_.clear();
    int taken = 0;
    auto now = Wall::now();
    while (!queue_.empty() && taken < max_calls) {
      auto found = table_.find(queue_.front());
      queue_.pop_front();
      if (found == table_.end()) continue;  // ended while queued
      Held& held = found->second;
      double remaining = -1.0;  // no deadline
      if (held.deadline != Wall::time_point::max()) {
        remaining = std::max(0.0, std::chrono::duration<double>(held.deadline - now).count());
      }
      uint64_t id = found->first;
      uint32_t size = static_cast<uint32_t>(held.request.size());
      int32_t method = held.method_index;
      Append(&id, sizeof(id));
      Append(&remaining, sizeof(remaining));
      Append(&method, sizeof(method));
      Append(&size, sizeof(size));
      Append(held.request.data(), size);
      std::string().swap(held.request);  // Python has its copy; the bytes stay counted until the answer
      held.taken = true;
      ++taken;
    }
    bool left = Rearm();
    bool done = taken == 0 && closed_;
    lock.unlock();
    if (left) Tell();
    return done ? -1 : taken;
  }

  const std::string& batch() const { return batch_; }

  void StartDraining() {
    std::lock_guard<std::mutex> lock(mutex_);
    draining_ = true;
  }

  void Close() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      closed_ = true;
    }
    reap_.notify_all();
    Tell();
  }

  // Ends every call still held (the grace period is over): Python's later answers find nothing.
  void EndAll(const grpc::Status& status) {
    std::vector<Call*> calls;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto& entry : table_) {
        calls.push_back(entry.second.call);
        if (!entry.second.taken) Count(entry.second.method_index, status.error_code());
      }
      table_.clear();
      probes_open_ = 0;
      queue_.clear();
      dropped_.clear();
      bytes_ = 0;
      admitted_ = 0;
    }
    for (Call* call : calls) call->End(status);
  }

  int held() {
    std::lock_guard<std::mutex> lock(mutex_);
    return admitted_;
  }

  // Calls not yet ended but health checks (which a client could keep coming during a drain).
  int open() {
    std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<int>(table_.size()) - probes_open_;
  }

  // Relayed calls not yet done, and the bytes of client messages they hold.
  void Relays(int64_t* out) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      out[0] = relays_;
    }
    out[1] = relay_budget_.held();
  }

  // Calls this side ended before Python took them, by method and status code (0-16), since the start:
  // out[method * kCodes + code].
  void Counts(int64_t* out) {
    for (size_t i = 0; i < methods_.size() * kCodes; ++i) out[i] = ended_[i].load();
  }

 private:
  struct Held {
    Call* call = nullptr;
    int method_index = 0;
    Steady::time_point created;
    Wall::time_point deadline = Wall::time_point::max();
    bool read = false;    // its request came (it counts against max_calls and the bytes)
    bool taken = false;   // Python took it (Python counts how it ends)
    bool probe = false;   // a health check (not counted against max_open or max_calls)
    int64_t bytes = 0;    // of its request
    std::string request;  // until Python takes it
  };

  // Ends the calls whose request has not come within the read timeout (checked a few times a timeout).
  void Reap() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!closed_) {
      reap_.wait_for(lock, std::max(read_timeout_ / 4, Steady::duration(std::chrono::milliseconds(10))));
      std::vector<Call*> late;
      auto now = Steady::now();
      for (auto it = table_.begin(); it != table_.end();) {
        if (!it->second.read && now - it->second.created > read_timeout_) {
          Count(it->second.method_index, grpc::StatusCode::DEADLINE_EXCEEDED);
          probes_open_ -= it->second.probe;
          late.push_back(it->second.call);
          it = table_.erase(it);
        } else {
          ++it;
        }
      }
      lock.unlock();
      for (Call* call : late) {
        call->End(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "the request did not arrive within the read timeout"));
      }
      lock.lock();
    }
  }

  void Append(const void* data, size_t size) { batch_.append(static_cast<const char*>(data), size); }
  // Something came (under the lock): true when the caller must write the eventfd (after unlocking).
  bool ShouldTell() {
    bool tell = !told_;
    told_ = true;
    return tell;
  }
  // After a take or a read of the drops (under the lock): with nothing left, the next arrival or drop
  // writes the eventfd; with something left, true: the caller writes it again (after unlocking), for the
  // loop may have read it before that came, and would never look again.
  bool Rearm() {
    if (queue_.empty() && dropped_.empty()) {
      told_ = false;
      return false;
    }
    told_ = true;
    return true;
  }
  void Count(int method, grpc::StatusCode code) {
    if (code >= 0 && code < kCodes) ++ended_[method * kCodes + code];
  }
  void Tell() {
    uint64_t one = 1;
    if (write(wakeup_, &one, sizeof(one)) < 0) {
    }  // full (never: the counter is read on each wake-up) or closed: nothing to tell
  }

  std::vector<std::string> methods_;
  int first_probe_;     // methods from this index on are health checks
  int probes_open_ = 0;  // health checks not yet ended
  std::unique_ptr<grpc::GenericStub> relay_;
  relay::Budget relay_budget_;
  int relays_ = 0;  // relayed calls not yet done
  int max_calls_;
  int64_t max_request_bytes_;
  int max_open_;
  Steady::duration read_timeout_;
  int64_t bytes_ = 0;  // requests of the calls held
  int admitted_ = 0;   // calls whose request was read, not yet ended
  std::mutex mutex_;
  std::condition_variable reap_;  // the reaper's
  std::unordered_map<uint64_t, Held> table_;  // calls not yet ended
  std::deque<uint64_t> queue_;               // calls read, not yet taken by Python
  std::vector<std::pair<uint64_t, int64_t>> dropped_;  // see Dropped
  std::string batch_;                        // the last group taken (one taker)
  uint64_t last_id_ = 0;
  bool draining_ = false;
  bool closed_ = false;
  bool told_ = false;  // the eventfd was written since a take or drop read last left nothing (Rearm)
  int wakeup_;
  std::unique_ptr<std::atomic<int64_t>[]> ended_;  // see Counts
  std::thread reaper_;                        // last: starts once the rest is made
};

void Call::Begin() { StartRead(&request_); }

void Call::OnReadDone(bool ok) {
  if (!ok) {  // the client went away, or half-closed without a request
    grpc::Status status = context_->IsCancelled()
                              ? grpc::Status::CANCELLED
                              : grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "request: no message before the client's end");
    if (transport_->Take(id_, status.error_code()) != nullptr) Finish(status);
    return;
  }
  std::vector<grpc::Slice> slices;
  if (!request_.Dump(&slices).ok()) {
    if (transport_->Take(id_, grpc::StatusCode::INTERNAL) != nullptr) {
      Finish(grpc::Status(grpc::StatusCode::INTERNAL, "unreadable request"));
    }
    return;
  }
  std::string request;
  request.reserve(request_.Length());
  for (const grpc::Slice& slice : slices) request.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  request_.Clear();
  std::string refusal = transport_->Arrived(id_, context_->deadline(), std::move(request));
  if (!refusal.empty() && transport_->Take(id_, grpc::StatusCode::RESOURCE_EXHAUSTED) != nullptr) {
    Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, refusal));
  }
}

// A cancel this close to the call's deadline is its client's deadline (DEADLINE_SLACK_S in the batcher).
constexpr auto kDeadlineSlack = std::chrono::milliseconds(250);

void Call::OnCancel() {
  // a deadline that passed ends the call as a cancellation does; the client saw DEADLINE_EXCEEDED then
  bool expired = context_->deadline() <= Wall::now() + kDeadlineSlack;
  int code = expired ? grpc::StatusCode::DEADLINE_EXCEEDED : grpc::StatusCode::CANCELLED;
  if (transport_->Take(id_, code) != nullptr) Finish(grpc::Status::CANCELLED);
}

void Call::OnDone() { delete this; }

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
