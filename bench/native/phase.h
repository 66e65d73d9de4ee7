// What bertserve-loadgen (loadgen.cc, gRPC) and bertserve-http-loadgen (http_loadgen.cc) share: the records of
// the requests file and a phase's steps (warm-up, "ready", "go", the measured part, its stats line).
// The build keys each binary by its source and this header (service/grpc/native/build.py).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

namespace phase {

struct Record {
  double offset_s;  // scheduled send time from the phase's start; < 0: closed loop
  std::string bytes;
};

// REQUESTS_FILE: records of [f64 scheduled send offset, s][u32 length][bytes].
inline std::vector<Record> read_records(const char* path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(std::string("cannot read ") + path);
  std::vector<Record> records;
  while (true) {
    double offset;
    uint32_t length;
    if (!in.read(reinterpret_cast<char*>(&offset), sizeof offset)) {
      if (in.gcount() != 0) throw std::runtime_error("truncated record head");
      break;
    }
    if (!in.read(reinterpret_cast<char*>(&length), sizeof length)) throw std::runtime_error("truncated");
    std::string bytes(length, '\0');
    if (!in.read(bytes.data(), length)) throw std::runtime_error("truncated record");
    records.push_back({offset, std::move(bytes)});
  }
  return records;
}

inline double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// The command line both take: TARGET METHOD REQUESTS_FILE OUT_FILE CONCURRENCY WARMUP TIME_LIMIT_S TIMEOUT_S
// [CONNECTIONS [THREADS]] (THREADS: the gRPC one's closed loops; the HTTP one runs on one thread).
struct Command {
  std::string target, method, timeout_text;
  std::vector<Record> records;
  const char* out_path;
  std::FILE* out;
  size_t concurrency, warmup;
  double time_limit_s, timeout_s;
  size_t connections;  // 0: not given
  size_t threads;      // 1 unless given
};

// `name`'s main: parses the command line (usage and exit 2 when wrong) into a Command for `body`, whose
// result is the exit code; an exception ends it with one line and exit 1.
template <class Body>
int main_of(int argc, char** argv, const char* name, const char* usage, Body&& body) {
  if (argc < 9 || argc > 11) {
    std::cerr << "usage: " << name << " " << usage << "\n";
    return 2;
  }
  try {
    Command c{argv[1], argv[2], argv[8], read_records(argv[3]), argv[4], std::fopen(argv[4], "wb"), 0, 0,
              std::atof(argv[7]), std::atof(argv[8]), 0, 1};
    if (!c.out) throw std::runtime_error(std::string("cannot write ") + argv[4]);
    c.concurrency = std::max<long>(1, std::atol(argv[5]));
    c.warmup = std::min<size_t>(std::atol(argv[6]), c.records.size());
    c.connections = argc >= 10 ? std::max<long>(1, std::atol(argv[9])) : 0;
    c.threads = argc == 11 ? std::max<long>(1, std::atol(argv[10])) : 1;
    return body(c);
  } catch (const std::exception& error) {
    std::cerr << name << ": " << error.what() << "\n";
    return 1;
  }
}

// `run(first, last, time_limit_s, record)` sends requests [first, last) and returns how many it sent: the
// first `warmup` unrecorded, then "ready" on stdout and a line awaited on stdin, then the rest, recorded, and
// the stats line {"seconds", "cpu_s", "sent", "stopped_early"[, "threads": *threads after the run]}.
// Returns the exit code (4: stdin closed).
template <class Run>
int drive(const Command& c, Run&& run, const size_t* threads = nullptr) {
  run(0, c.warmup, 0.0, false);
  std::cout << "ready" << std::endl;
  std::string go;
  if (!std::getline(std::cin, go)) return 4;  // the driver went away
  const double cpu_before = process_cpu_seconds();
  const auto start = std::chrono::steady_clock::now();
  const size_t sent = run(c.warmup, c.records.size(), c.time_limit_s, true);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double cpu_s = process_cpu_seconds() - cpu_before;
  if (std::ferror(c.out) || std::fclose(c.out) != 0) throw std::runtime_error(std::string("cannot write ") + c.out_path);
  std::printf("{\"seconds\": %.9f, \"cpu_s\": %.9f, \"sent\": %zu, \"stopped_early\": %d, \"threads\": %zu}\n",
              seconds, cpu_s, sent, sent < c.records.size() - c.warmup ? 1 : 0, threads ? *threads : 1);
  std::fflush(stdout);
  return 0;
}

}  // namespace phase
