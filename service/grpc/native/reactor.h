// bertserve's native transport, part five (included by transport.cc, after transport.h): gRPC's side of a
// call, the Transport's reactor factory (a new call held, relayed or refused), the admission of a call's
// request once read, and the Call's callbacks.
#pragma once

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

// In the anonymous namespace of the one translation unit (transport.cc) that includes this.
namespace {

inline grpc::ServerGenericBidiReactor* Transport::CreateReactor(grpc::GenericCallbackServerContext* context) {
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
inline grpc::ServerGenericBidiReactor* Transport::Relayed(grpc::GenericCallbackServerContext* context) {
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
inline std::string Transport::Arrived(uint64_t id, Wall::time_point deadline, std::string&& request) {
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

}  // namespace
