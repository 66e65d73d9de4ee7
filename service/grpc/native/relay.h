// bertserve's native transport, part two (included by transport.cc): a call of a method the transport does
// not answer itself (streams: EmbedStream, health Watch, reflection) relayed to the front's own grpc.aio
// server on a private socket, so the native port serves every method the main port serves. Messages move one
// at a time each way (each side's flow control holds the rest); the client's metadata and deadline go
// upstream, the status and trailing metadata come back, a cancel on either side ends both.
//
// Bounds: the transport counts relays (at most its max_open); the client messages relays hold at once are
// within a byte budget (a relay whose message would pass it ends with RESOURCE_EXHAUSTED); a relay holds
// at most one reply, which the upstream server's own stream bounds produce.
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <string>

namespace relay {

// Whether a client's metadata key goes upstream: not gRPC's own or the transport's.
inline bool Forwarded(const std::string& name) {
  return !name.empty() && name[0] != ':' && name.rfind("grpc-", 0) != 0 && name != "user-agent" && name != "te" &&
         name != "content-type";
}

// Why the client's metadata cannot go upstream ("" when it can): gRPC's client side aborts the process on a
// key or value its server side accepted (upper case, control or non-ASCII bytes).
inline std::string InvalidMetadata(const grpc::GenericCallbackServerContext* context) {
  for (const auto& [key, value] : context->client_metadata()) {
    std::string name(key.data(), key.size());
    if (!Forwarded(name)) continue;
    bool binary = name.size() > 4 && name.compare(name.size() - 4, 4, "-bin") == 0;
    for (char c : name) {
      if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.')) {
        return "metadata key " + name.substr(0, 64) + ": not a valid gRPC key on this port";
      }
    }
    for (size_t i = 0; !binary && i < value.size(); ++i) {
      auto byte = static_cast<unsigned char>(value.data()[i]);
      if (byte < 0x20 || byte > 0x7e) {
        return "metadata " + name.substr(0, 64) + ": only printable ASCII on this port (or a -bin key)";
      }
    }
  }
  return "";
}

// The client messages all relays hold, against one budget (a lone message always fits).
class Budget {
 public:
  explicit Budget(int64_t limit) : limit_(limit) {}
  bool Take(int64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (held_ > 0 && held_ + bytes > limit_) return false;
    held_ += bytes;
    return true;
  }
  void Give(int64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    held_ -= bytes;
  }
  int64_t limit() const { return limit_; }
  int64_t held() {
    std::lock_guard<std::mutex> lock(mutex_);
    return held_;
  }

 private:
  std::mutex mutex_;
  int64_t limit_;
  int64_t held_ = 0;
};

class Relay : public grpc::ServerGenericBidiReactor {
 public:
  Relay(grpc::GenericStub* stub, grpc::GenericCallbackServerContext* context, Budget* budget,
        std::function<void()> on_done)
      : context_(context), budget_(budget), on_done_(std::move(on_done)), method_(context->method()), upstream_(this) {
    for (const auto& [key, value] : context->client_metadata()) {
      std::string name(key.data(), key.size());
      if (Forwarded(name)) client_context_.AddMetadata(name, std::string(value.data(), value.size()));
    }
    client_context_.set_deadline(context->deadline());
    stub->PrepareBidiStreamingCall(&client_context_, method_, grpc::StubOptions(), &upstream_);
    upstream_.AddMultipleHolds(2);  // the client-to-server side and the reply pump; each removed once
    upstream_.StartRead(&down_);
    upstream_.StartCall();
    StartRead(&up_);
  }

  // A client message (ok), or the client's end (half-close or cancel).
  void OnReadDone(bool ok) override {
    bool write = false, refused = false, close = false, half_close = false;
    int64_t size = ok ? static_cast<int64_t>(up_.Length()) : 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (ok && write_hold_ && sending_) {
        if (budget_->Take(size)) {
          held_ = size;
          writing_ = write = true;
        } else {
          refused_ = refused = true;
        }
      }
      if (!write) {
        client_closed_ = !ok;
        half_close = !ok && sending_;
        sending_ = false;
        close = ReleaseWriteHold();
      }
    }
    if (write) upstream_.StartWrite(&up_);
    if (!write) up_.Clear();  // a message not sent on (refused, or upstream over) frees its bytes now
    if (refused) client_context_.TryCancel();
    if (close) EndWrites(half_close);
  }

  // A reply written to the client: read the next one, or stop the reply pump (the client went away).
  void OnWriteDone(bool ok) override {
    bool read = false, release = false;
    down_.Clear();  // sent: its bytes go now, not when the next reply comes
    {
      std::lock_guard<std::mutex> lock(mutex_);
      replying_ = false;
      if (ok && pumping_) {
        read = true;
      } else {
        pumping_ = false;
        release = ReleaseReadHold();
      }
    }
    if (read) upstream_.StartRead(&down_);
    if (!ok) client_context_.TryCancel();
    if (release) upstream_.RemoveHold();
  }

  void OnCancel() override { client_context_.TryCancel(); }

  // Always after Finish, which only UpstreamDone calls: the relay is done with both calls.
  void OnDone() override {
    on_done_();
    delete this;
  }

 private:
  class Upstream : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
   public:
    explicit Upstream(Relay* relay) : relay_(relay) {}
    void OnReadDone(bool ok) override { relay_->UpstreamRead(ok); }
    void OnWriteDone(bool ok) override { relay_->UpstreamWritten(ok); }
    void OnDone(const grpc::Status& status) override { relay_->UpstreamDone(status); }

   private:
    Relay* relay_;
  };

  // The client's message went upstream (ok) or could not: read the next, or close this side.
  void UpstreamWritten(bool ok) {
    bool read = false, close = false, half_close = false;
    up_.Clear();  // written upstream (or not): its bytes go with its share of the budget
    {
      std::lock_guard<std::mutex> lock(mutex_);
      budget_->Give(held_);
      held_ = 0;
      writing_ = false;
      if (ok && sending_) {
        read = true;
      } else {
        half_close = ok && !refused_ && client_closed_;
        sending_ = false;
        close = ReleaseWriteHold();
      }
    }
    if (read) StartRead(&up_);
    if (close) EndWrites(half_close);
  }

  // A reply from upstream (ok), or its end: upstream has its status, so the client's side closes too (a
  // client that waits for a reply before sending more would otherwise never learn it).
  void UpstreamRead(bool ok) {
    bool write = false, release = false, close = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (ok && pumping_) {
        replying_ = write = true;
      } else {
        pumping_ = false;
        release = ReleaseReadHold();
        if (!ok) {
          sending_ = false;
          close = ReleaseWriteHold();
        }
      }
    }
    if (write) StartWrite(&down_);
    if (close) EndWrites(false);
    if (release) upstream_.RemoveHold();
  }

  // Upstream is over (both holds gone, every operation done): the client gets its status. Finish is the
  // last use of `this`: OnDone may delete the relay as soon as it is called.
  void UpstreamDone(const grpc::Status& status) {
    for (const auto& [key, value] : client_context_.GetServerTrailingMetadata()) {
      std::string name(key.data(), key.size());
      if (name.rfind("grpc-", 0) != 0) context_->AddTrailingMetadata(name, std::string(value.data(), value.size()));
    }
    bool refused;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      refused = refused_;
    }
    if (refused) {
      Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          "stream messages held by the native port pass max_request_bytes_in_flight " +
                              std::to_string(budget_->limit()) + "; retry later"));
    } else {
      Finish(status);
    }
  }

  // Under the lock: true once when the client-to-server side is over and no write is pending.
  bool ReleaseWriteHold() {
    if (!write_hold_ || writing_) return false;
    write_hold_ = false;
    return true;
  }
  bool ReleaseReadHold() {
    if (!read_hold_ || replying_) return false;
    read_hold_ = false;
    return true;
  }
  // The client-to-server side is over: upstream learns the client's end (`half_close`), then its hold goes.
  void EndWrites(bool half_close) {
    if (half_close) upstream_.StartWritesDone();
    upstream_.RemoveHold();
  }

  grpc::GenericCallbackServerContext* context_;
  Budget* budget_;
  std::function<void()> on_done_;
  std::string method_;  // outlives the upstream call, which keeps a pointer to it
  grpc::ClientContext client_context_;
  Upstream upstream_;
  grpc::ByteBuffer up_, down_;  // the client's message on its way, the reply on its way
  std::mutex mutex_;
  bool sending_ = true;    // the client's messages still go upstream
  bool writing_ = false;   // one is being written upstream
  bool write_hold_ = true;  // upstream's hold for that side
  bool pumping_ = true;    // replies still go to the client
  bool replying_ = false;  // one is being written to the client
  bool read_hold_ = true;  // upstream's hold for that side
  bool refused_ = false;   // a message passed the budget
  bool client_closed_ = false;  // the client ended its side (half-close or cancel)
  int64_t held_ = 0;       // bytes of the message being written upstream, taken from the budget
};

}  // namespace relay
