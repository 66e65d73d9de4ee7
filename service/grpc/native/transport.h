// bertserve's native transport, part four (included by transport.cc, after call.h): the Transport, the table
// of the calls held, the queue Python takes from and the eventfd that tells it, the limits, the drain, the
// read-timeout reaper and the counters. gRPC's side of a call (a new call, its request read) is in reactor.h.
#pragma once

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

// In the anonymous namespace of the one translation unit (transport.cc) that includes this.
namespace {

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

  // gRPC's side of a call (reactor.h): a new call, held, relayed or refused; its request once read.
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* context) override;
  grpc::ServerGenericBidiReactor* Relayed(grpc::GenericCallbackServerContext* context);
  std::string Arrived(uint64_t id, Wall::time_point deadline, std::string&& request);

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

}  // namespace
