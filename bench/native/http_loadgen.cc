// bertserve-http-loadgen: the bench's native HTTP/1.1 load generator (bench/native_loadgen.py drives it).
//
// The bench's Python HTTP client spends more CPU per call than the server's HTTP front; on a GPU machine's
// many cores one Python process caps the rate it can offer. This client keeps its connections on one epoll
// loop (one thread), sends pre-built POST requests (keep-alive, one request at a time per connection, as
// HTTP/1.1 clients without pipelining do) and records each reply's body for the Python side to parse.
//
// Usage: bertserve-http-loadgen HOST:PORT PATH REQUESTS_FILE OUT_FILE CONCURRENCY WARMUP TIME_LIMIT_S
//        TIMEOUT_S [CONNECTIONS]
//   As bertserve-loadgen (loadgen.cc), with these differences: each record's bytes are a JSON body, POSTed
//   to PATH with an X-Request-Timeout header of TIMEOUT_S; CONNECTIONS (default CONCURRENCY) is the most
//   connections open at once: a request waits for an idle one, or opens one while fewer are open. A closed
//   loop's callers share them; an open loop's requests take them in order of their send times.
//   OUT_FILE records: status 0 for HTTP 200, else the HTTP status (its body recorded: the error), or
//   4 (no answer within TIMEOUT_S) or 14 (the connection failed or closed), gRPC's codes for them.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "phase.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr int32_t DEADLINE_EXCEEDED = 4, UNAVAILABLE = 14;  // gRPC's codes, as the Python side names them

struct Request {
  double offset_s;  // scheduled send time from the phase's start; < 0: closed loop
  std::string bytes;  // the whole HTTP request
};

struct Connection {
  int fd = -1;
  size_t slot = 0;
  uint64_t id = 0;  // told apart from a later connection in the same slot
  bool watching_writes = false;
  bool busy = false;
  size_t index = 0;  // the request it carries
  bool recorded = false;
  Clock::time_point started, deadline;
  const std::string* out = nullptr;  // request bytes, sent from `sent` on
  size_t sent = 0;
  std::string in;  // reply bytes so far
  size_t head_end = 0, body_length = 0;  // known once the head is complete (head_end > 0)
  int status = 0;
  bool close_after = false;
  bool used = false;  // a request was answered on it: kept alive, so the server may have closed it since
};

// The value of header `name` (lower case) in `head`, or "" when absent; names compare case-insensitively.
std::string header(const std::string& head, const std::string& name) {
  size_t at = head.find("\r\n");
  while (at != std::string::npos && at + 2 < head.size()) {
    size_t start = at + 2, end = head.find("\r\n", start), colon = head.find(':', start);
    if (end == std::string::npos) end = head.size();
    if (colon != std::string::npos && colon < end && colon - start == name.size()) {
      bool same = true;
      for (size_t k = 0; k < name.size() && same; ++k)
        same = std::tolower(static_cast<unsigned char>(head[start + k])) == name[k];
      if (same) {
        size_t v = head.find_first_not_of(' ', colon + 1);
        return v < end ? head.substr(v, end - v) : "";
      }
    }
    at = end < head.size() ? end : std::string::npos;
  }
  return "";
}

class Runner {
 public:
  Runner(sockaddr_in address, size_t connections, double timeout_s)
      : address_(address), slots_(connections), timeout_(timeout_s), epoll_(epoll_create1(0)) {
    if (epoll_ < 0) throw std::runtime_error("epoll_create1 failed");
    for (size_t k = connections; k-- > 0;) unopened_.push_back(k);
  }

  // Sends requests[first, last) and waits for all of them; open loop when their offsets are >= 0.
  // Returns how many were sent (fewer than last - first when the time limit cut the phase short).
  size_t run(const std::vector<Request>& requests, size_t first, size_t last, size_t concurrency,
             double time_limit_s, bool record, std::FILE* out) {
    requests_ = &requests, out_ = out, record_ = record;
    const Clock::time_point start = Clock::now();
    const bool open = first < last && requests[first].offset_s >= 0;
    size_t next = first;
    in_flight_ = 0;
    auto limit_passed = [&] {
      return time_limit_s > 0 && std::chrono::duration<double>(Clock::now() - start).count() > time_limit_s;
    };
    auto past_limit = [&](size_t i) {
      return time_limit_s > 0 && (requests[i].offset_s > time_limit_s || limit_passed());
    };
    auto due = [&](size_t i) {
      return start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(requests[i].offset_s));
    };
    if (!open)
      while (next < last && in_flight_ < concurrency) issue(next++, Clock::now());
    Clock::time_point next_sweep = Clock::now();
    std::vector<epoll_event> events(256);
    while (in_flight_ > 0 || (open && next < last)) {
      int wait_ms = 100;
      if (open) {
        // everything due goes out first; none once the time limit has passed, nor one scheduled after it
        while (next < last && due(next) <= Clock::now() && !past_limit(next)) issue(next, due(next)), ++next;
        if (next < last && past_limit(next)) last = next;
        if (next < last)
          wait_ms = std::clamp<int>(
              std::chrono::duration_cast<std::chrono::milliseconds>(due(next) - Clock::now()).count(), 0, 100);
        else if (in_flight_ == 0)
          break;
      }
      int ready = epoll_wait(epoll_, events.data(), static_cast<int>(events.size()), wait_ms);
      if (ready < 0 && errno != EINTR) throw std::runtime_error("epoll_wait failed");
      for (int k = 0; k < ready; ++k) {
        const size_t slot = events[k].data.u64;
        Connection* c = slots_[slot].get();
        if (c == nullptr) continue;  // closed by an earlier event of this batch
        if (!c->busy) {
          close_connection(*c);  // an idle connection is readable only when the server closed it
          continue;
        }
        const uint64_t id = c->id;
        if (events[k].events & EPOLLOUT) send_more(*c);
        if (!slots_[slot] || slots_[slot]->id != id) continue;  // sending failed: closed (maybe reopened)
        if (c->busy && (events[k].events & (EPOLLIN | EPOLLHUP | EPOLLERR))) receive(*c);
      }
      if (Clock::now() >= next_sweep) {  // requests past their timeout
        next_sweep = Clock::now() + std::chrono::milliseconds(50);
        for (auto& slot : slots_)
          if (slot && slot->busy && Clock::now() >= slot->deadline) finish(*slot, DEADLINE_EXCEEDED, true);
      }
      if (!open) {
        while (next < last && in_flight_ < concurrency) {
          if (limit_passed()) {
            last = next;
            break;
          }
          issue(next++, Clock::now());
        }
      }
    }
    return next - first;
  }

 private:
  // Request `index` goes out on an idle connection, a new one, or waits for one.
  void issue(size_t index, Clock::time_point scheduled) {
    ++in_flight_;
    waiting_.push_back({index, scheduled});
    dispatch();
  }

  void dispatch() {
    while (!waiting_.empty()) {
      Connection* c = idle();
      if (c == nullptr) return;
      auto [index, scheduled] = waiting_.front();
      waiting_.pop_front();
      c->busy = true, c->index = index, c->recorded = record_, c->started = scheduled;
      c->deadline = scheduled + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_));
      c->out = &(*requests_)[index].bytes, c->sent = 0;
      c->in.clear(), c->head_end = 0, c->body_length = 0, c->status = 0, c->close_after = false;
      send_more(*c);
    }
  }

  // An idle open connection, else a new one while fewer than CONNECTIONS are open, else null.
  Connection* idle() {
    if (!idle_.empty()) {
      Connection* c = slots_[idle_.back()].get();
      idle_.pop_back();
      return c;
    }
    if (unopened_.empty()) return nullptr;
    const size_t slot = unopened_.back();
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, reinterpret_cast<const sockaddr*>(&address_), sizeof address_) != 0)
      throw std::runtime_error(std::string("cannot connect: ") + std::strerror(errno));
    unopened_.pop_back();
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) != 0) throw std::runtime_error("fcntl failed");
    slots_[slot] = std::make_unique<Connection>();
    slots_[slot]->fd = fd, slots_[slot]->slot = slot, slots_[slot]->id = ++opened_;
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.u64 = slot;
    epoll_ctl(epoll_, EPOLL_CTL_ADD, fd, &event);
    return slots_[slot].get();
  }

  void watch_writes(Connection& c, bool on) {
    c.watching_writes = on;
    epoll_event event{};
    event.events = on ? EPOLLIN | EPOLLOUT : EPOLLIN;
    event.data.u64 = c.slot;
    epoll_ctl(epoll_, EPOLL_CTL_MOD, c.fd, &event);
  }

  void close_connection(Connection& c) {
    const size_t slot = c.slot;
    if (!c.busy) idle_.erase(std::remove(idle_.begin(), idle_.end(), slot), idle_.end());
    epoll_ctl(epoll_, EPOLL_CTL_DEL, c.fd, nullptr);
    ::close(c.fd);
    slots_[slot].reset();
    unopened_.push_back(slot);
  }

  void send_more(Connection& c) {
    if (!c.busy || c.out == nullptr || c.sent == c.out->size()) return;
    ssize_t n = ::send(c.fd, c.out->data() + c.sent, c.out->size() - c.sent, MSG_NOSIGNAL);
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return lost(c);
    if (n > 0) c.sent += static_cast<size_t>(n);
    const bool more = c.sent < c.out->size();
    if (more != c.watching_writes) watch_writes(c, more);
  }

  void receive(Connection& c) {
    char buffer[64 * 1024];
    while (true) {
      ssize_t n = ::recv(c.fd, buffer, sizeof buffer, 0);
      if (n == 0) return lost(c);  // closed before its answer was complete
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        return lost(c);
      }
      c.in.append(buffer, static_cast<size_t>(n));
      if (c.head_end == 0) {
        size_t end = c.in.find("\r\n\r\n");
        if (end == std::string::npos) continue;
        c.head_end = end + 4;
        const std::string head = c.in.substr(0, end);
        c.status = std::atoi(head.c_str() + std::min<size_t>(head.size(), 9));  // "HTTP/1.1 200 OK"
        const std::string length = header(head, "content-length");
        // chunked (not what bertserve sends) or no status line: the connection cannot be read on
        if (length.empty() || c.status < 100) return finish(c, UNAVAILABLE, true);
        c.body_length = std::strtoull(length.c_str(), nullptr, 10);
        c.close_after = header(head, "connection") == "close";
      }
      if (c.in.size() >= c.head_end + c.body_length)  // answered before all was sent (a refusal): closed
        return finish(c, c.status == 200 ? 0 : c.status, c.close_after || c.sent < c.out->size());
    }
  }

  // The connection failed or closed: its request is sent again on another when the server may have closed
  // this kept-alive one before it saw the request (nothing of an answer came), as HTTP clients do; else it
  // fails with UNAVAILABLE.
  void lost(Connection& c) {
    if (!c.used || !c.in.empty()) return finish(c, UNAVAILABLE, true);
    waiting_.push_front({c.index, c.started});
    c.busy = false;
    close_connection(c);
    dispatch();
  }

  // Records the connection's request with `code` and frees the connection (closing it when `close`).
  void finish(Connection& c, int32_t code, bool close) {
    if (!c.busy) return;
    if (c.recorded) {
      uint32_t index = static_cast<uint32_t>(c.index);
      double latency = std::chrono::duration<double>(Clock::now() - c.started).count();
      uint32_t length = 0;
      const char* body = nullptr;
      if (code != DEADLINE_EXCEEDED && code != UNAVAILABLE && c.head_end > 0) {
        length = static_cast<uint32_t>(c.body_length);
        body = c.in.data() + c.head_end;
      }
      std::fwrite(&index, sizeof index, 1, out_);
      std::fwrite(&code, sizeof code, 1, out_);
      std::fwrite(&latency, sizeof latency, 1, out_);
      std::fwrite(&length, sizeof length, 1, out_);
      if (length) std::fwrite(body, 1, length, out_);
    }
    c.busy = false, c.used = true;
    --in_flight_;
    if (close)
      close_connection(c);
    else
      idle_.push_back(c.slot);
    dispatch();
  }

  sockaddr_in address_;
  std::vector<std::unique_ptr<Connection>> slots_;  // at most CONNECTIONS open; null: none in that slot
  std::vector<size_t> idle_, unopened_;  // slots: open and idle; without a connection
  double timeout_;
  int epoll_;
  std::deque<std::pair<size_t, Clock::time_point>> waiting_;  // requests issued, no connection yet
  const std::vector<Request>* requests_ = nullptr;
  std::FILE* out_ = nullptr;
  bool record_ = false;
  size_t in_flight_ = 0;  // issued, not finished (waiting or on a connection)
  uint64_t opened_ = 0;  // connections opened so far
};

sockaddr_in resolve(const std::string& target) {
  const size_t colon = target.rfind(':');
  if (colon == std::string::npos) throw std::runtime_error("target is not HOST:PORT: " + target);
  addrinfo hints{}, *found = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(target.substr(0, colon).c_str(), target.substr(colon + 1).c_str(), &hints, &found) != 0)
    throw std::runtime_error("cannot resolve " + target);
  sockaddr_in address = *reinterpret_cast<sockaddr_in*>(found->ai_addr);
  freeaddrinfo(found);
  return address;
}

}  // namespace

int main(int argc, char** argv) {
  const char* usage = "HOST:PORT PATH REQUESTS_FILE OUT_FILE CONCURRENCY WARMUP TIME_LIMIT_S TIMEOUT_S [CONNECTIONS]";
  return phase::main_of(argc, argv, "bertserve-http-loadgen", usage, [](phase::Command& c) {
    const std::string head = "POST " + c.method + " HTTP/1.1\r\nHost: " + c.target +
                             "\r\nContent-Type: application/json\r\nX-Request-Timeout: " + c.timeout_text +
                             "\r\nContent-Length: ";
    std::vector<Request> requests;
    for (auto& record : c.records)
      requests.push_back({record.offset_s, head + std::to_string(record.bytes.size()) + "\r\n\r\n" + record.bytes});
    Runner runner(resolve(c.target), c.connections ? c.connections : c.concurrency, c.timeout_s);
    return phase::drive(c, [&](size_t first, size_t last, double limit, bool record) {
      return runner.run(requests, first, last, c.concurrency, limit, record, c.out);
    });
  });
}
