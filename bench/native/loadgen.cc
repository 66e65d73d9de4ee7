// bertserve-loadgen: the bench's native gRPC load generator (bench/native_loadgen.py drives it).
//
// A Python grpc.aio client spends about 0.5 ms of CPU per call; on the 2 cores a bench shares with the
// server that is CPU taken from the server under test. This client sends pre-serialized requests through
// gRPC's C++ generic stub on one completion queue per thread of ours, as Triton's perf_analyzer does in
// C++, and records each reply's bytes for the Python side to parse.
//
// Usage: bertserve-loadgen TARGET METHOD REQUESTS_FILE OUT_FILE CONCURRENCY WARMUP TIME_LIMIT_S TIMEOUT_S
//        [CONNECTIONS [THREADS]]
//   CONNECTIONS (default 1): TCP connections to TARGET, as that many clients would open; a closed loop's
//   callers are spread over them (each answered call's successor goes out on its connection), an open
//   loop's requests go round-robin. A server whose processes share one port (SO_REUSEPORT) gets each
//   connection in one of them, so one connection would measure one process.
//   THREADS (default 1): a closed loop's connections are shared out over this many threads, each with its
//   completion queue (at most one thread per connection), so one thread does not bound a fast server; an
//   open loop runs on one.
//   REQUESTS_FILE: records of [f64 scheduled send offset, s; negative: closed loop][u32 length][bytes].
//   The first WARMUP records are sent first, closed loop at CONCURRENCY, and not recorded. Then it writes
//   "ready\n" to stdout and waits for a line on stdin; the measured phase starts when that line comes:
//   - closed loop (offsets < 0): CONCURRENCY calls in flight, each answered call replaced by the next;
//   - open loop (offsets >= 0): each request sent at its offset from the start, whatever is in flight;
//     its latency counts from that scheduled time (no coordinated omission).
//   No request is sent once TIME_LIMIT_S (0: none) has passed, nor one scheduled after it; those sent
//   are awaited.
//   OUT_FILE: per answered request [u32 index][i32 status code][f64 latency s][u32 length][reply bytes].
//   stdout, last line: {"seconds": .., "cpu_s": .., "sent": .., "stopped_early": 0|1}
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "phase.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Request {
  double offset_s;  // scheduled send time from the phase's start; < 0: closed loop
  grpc::ByteBuffer payload;
};

struct Call {
  size_t index = 0;
  size_t connection = 0;
  bool recorded = false;
  Clock::time_point started;
  grpc::ClientContext context;
  grpc::ByteBuffer reply;
  grpc::Status status;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> reader;
};

// gRPC's deadlines take the system clock; the phase is timed on the steady one.
template <class Duration>
std::chrono::system_clock::time_point wall_clock_in(Duration from_now) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(from_now);
}

class Runner {
 public:
  Runner(const std::vector<std::shared_ptr<grpc::Channel>>& channels, std::string method, double timeout_s,
         size_t threads)
      : method_(std::move(method)), timeout_(timeout_s) {
    for (const auto& channel : channels) stubs_.push_back(std::make_unique<grpc::GenericStub>(channel));
    threads_ = std::max<size_t>(1, std::min(threads, stubs_.size()));
  }

  // A closed loop on every thread: caller k goes out on connection k % connections, which thread
  // (k % connections) % threads serves on its own queue; the request indexes are taken in turn by all.
  size_t run_closed(const std::vector<Request>& requests, size_t first, size_t last, size_t concurrency,
                    double time_limit_s, bool record, std::FILE* out) {
    const Clock::time_point start = Clock::now();
    std::atomic<size_t> next{first}, sent{0};
    std::atomic<bool> stopped{false};
    std::mutex writing;
    auto work = [&](size_t thread) {
      grpc::CompletionQueue queue;
      size_t in_flight = 0;
      auto send_next = [&](size_t connection) {
        if (stopped.load() ||
            (time_limit_s > 0 && std::chrono::duration<double>(Clock::now() - start).count() > time_limit_s)) {
          stopped.store(true);
          return;
        }
        const size_t index = next.fetch_add(1);
        if (index >= last) return;
        sent.fetch_add(1);
        start_call(new_call(index, connection, record, Clock::now()), requests[index].payload, &queue);
        ++in_flight;
      };
      for (size_t caller = 0; caller < concurrency; ++caller)
        if ((caller % stubs_.size()) % threads_ == thread) send_next(caller % stubs_.size());
      while (in_flight > 0) {
        void* tag = nullptr;
        bool ok = false;
        if (!queue.Next(&tag, &ok)) break;
        auto* call = static_cast<Call*>(tag);
        const Clock::time_point done = Clock::now();
        const size_t connection = call->connection;
        --in_flight;
        if (call->recorded) {
          std::lock_guard<std::mutex> lock(writing);
          write_record(out, *call, done);
        }
        delete call;
        send_next(connection);
      }
      queue.Shutdown();
      void* tag = nullptr;
      bool ok = false;
      while (queue.Next(&tag, &ok)) {}
    };
    struct Joined {  // every thread joined however this returns (an unjoined one would end the process)
      std::vector<std::thread> threads;
      ~Joined() {
        for (auto& thread : threads)
          if (thread.joinable()) thread.join();
      }
    } others;
    for (size_t thread = 1; thread < threads_; ++thread) others.threads.emplace_back(work, thread);
    work(0);
    return sent.load();
  }

  size_t threads() const { return threads_; }

  // Sends requests[first, last) and waits for all of them; open loop when their offsets are >= 0.
  // Returns how many were sent (fewer than last - first when the time limit cut the phase short).
  size_t run(const std::vector<Request>& requests, size_t first, size_t last, size_t concurrency,
             double time_limit_s, bool record, std::FILE* out) {
    const Clock::time_point start = Clock::now();
    const bool open = first < last && requests[first].offset_s >= 0;
    size_t next = first, in_flight = 0;
    auto limit_passed = [&] {
      return time_limit_s > 0 && std::chrono::duration<double>(Clock::now() - start).count() > time_limit_s;
    };
    size_t round_robin = 0;
    auto send = [&](Clock::time_point scheduled, size_t connection) {
      start_call(new_call(next, connection, record, scheduled), requests[next].payload, &queue_);
      ++next;
      ++in_flight;
    };
    auto due = [&](size_t i) {
      return start + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(requests[i].offset_s));
    };
    auto scheduled_past_limit = [&](size_t i) {
      return time_limit_s > 0 && requests[i].offset_s > time_limit_s;
    };
    if (!open)
      while (next < last && in_flight < concurrency) send(Clock::now(), in_flight % stubs_.size());
    while (in_flight > 0 || (open && next < last)) {
      if (open) {
        // everything due goes out first, so replies arriving back to back never hold up a send
        while (next < last && !scheduled_past_limit(next) && due(next) <= Clock::now())
          send(due(next), round_robin++ % stubs_.size());
        if (next < last && (scheduled_past_limit(next) || limit_passed())) {
          last = next;  // stop sending; await those sent (the loop ends here when none are in flight)
          continue;
        }
      }
      void* tag = nullptr;
      bool ok = false;
      if (open && next < last) {
        auto status = queue_.AsyncNext(&tag, &ok, wall_clock_in(due(next) - Clock::now()));
        if (status == grpc::CompletionQueue::TIMEOUT) continue;  // the next request is due
        if (status == grpc::CompletionQueue::SHUTDOWN) break;
      } else if (!queue_.Next(&tag, &ok)) {
        break;
      }
      auto* call = static_cast<Call*>(tag);
      const Clock::time_point done = Clock::now();
      const size_t connection = call->connection;
      --in_flight;
      if (call->recorded) write_record(out, *call, done);
      delete call;
      if (!open && next < last) {
        if (limit_passed())
          last = next;
        else
          send(Clock::now(), connection);
      }
    }
    return next - first;
  }

 private:
  static Call* new_call(size_t index, size_t connection, bool record, Clock::time_point started) {
    auto* call = new Call;
    call->index = index;
    call->connection = connection;
    call->recorded = record;
    call->started = started;
    return call;
  }

  void start_call(Call* call, const grpc::ByteBuffer& payload, grpc::CompletionQueue* queue) {
    call->context.set_deadline(wall_clock_in(std::chrono::duration<double>(timeout_)));
    call->reader = stubs_[call->connection]->PrepareUnaryCall(&call->context, method_, payload, queue);
    call->reader->StartCall();
    call->reader->Finish(&call->reply, &call->status, call);
  }

  static void write_record(std::FILE* out, Call& call, Clock::time_point done) {
    uint32_t index = static_cast<uint32_t>(call.index);
    int32_t code = static_cast<int32_t>(call.status.error_code());
    double latency = std::chrono::duration<double>(done - call.started).count();
    std::vector<grpc::Slice> slices;
    if (call.status.ok()) call.reply.Dump(&slices).IgnoreError();
    uint32_t length = 0;
    for (const auto& s : slices) length += static_cast<uint32_t>(s.size());
    std::fwrite(&index, sizeof index, 1, out);
    std::fwrite(&code, sizeof code, 1, out);
    std::fwrite(&latency, sizeof latency, 1, out);
    std::fwrite(&length, sizeof length, 1, out);
    for (const auto& s : slices) std::fwrite(s.begin(), 1, s.size(), out);
  }

  std::vector<std::unique_ptr<grpc::GenericStub>> stubs_;
  std::string method_;
  double timeout_;
  size_t threads_ = 1;
  grpc::CompletionQueue queue_;
};

}  // namespace

int main(int argc, char** argv) {
  const char* usage =
      "TARGET METHOD REQUESTS_FILE OUT_FILE CONCURRENCY WARMUP TIME_LIMIT_S TIMEOUT_S [CONNECTIONS [THREADS]]";
  return phase::main_of(argc, argv, "bertserve-loadgen", usage, [](phase::Command& c) {
    std::vector<Request> requests;
    for (auto& record : c.records) {
      grpc::Slice slice(record.bytes);
      requests.push_back({record.offset_s, grpc::ByteBuffer(&slice, 1)});
    }
    std::vector<std::shared_ptr<grpc::Channel>> channels;
    for (size_t k = 0; k < std::max<size_t>(1, c.connections); ++k) {
      grpc::ChannelArguments args;
      args.SetMaxReceiveMessageSize(64 << 20);
      args.SetMaxSendMessageSize(64 << 20);
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own, not a shared one
      channels.push_back(grpc::CreateCustomChannel(c.target, grpc::InsecureChannelCredentials(), args));
    }
    for (const auto& channel : channels) {
      if (!channel->WaitForConnected(wall_clock_in(std::chrono::seconds(30)))) {
        std::cerr << "bertserve-loadgen: cannot connect to " << c.target << "\n";
        return 3;
      }
    }
    Runner runner(channels, c.method, c.timeout_s, c.threads);
    size_t threads = 1;  // the last run's
    return phase::drive(
        c,
        [&](size_t first, size_t last, double limit, bool record) {
          const bool open = first < last && requests[first].offset_s >= 0;
          threads = open ? 1 : runner.threads();
          if (threads == 1) return runner.run(requests, first, last, c.concurrency, limit, record, c.out);
          return runner.run_closed(requests, first, last, c.concurrency, limit, record, c.out);
        },
        &threads);
  });
}
