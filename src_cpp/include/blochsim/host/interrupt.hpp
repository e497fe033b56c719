// Host-side safety of a call: stopping it from outside (Ctrl-C in Python,
// a cancel button in a C++ program), refusing a workspace that does not fit
// the memory available, and turning any C++ exception into a status so that
// nothing escapes an entry point.
//
// A caller installs a poll for the calls made on its thread
// (InterruptScope); the calling thread runs it between blocks of work, at
// most every poll_interval, and a non-zero return stops every thread of the
// call at its next block: the entry returns `interrupted` and its outputs
// hold whatever the finished blocks wrote.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <new>
#include <thread>

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif

#include "../config.hpp"

namespace blochsim {

// A poll run on the calling thread between blocks of work: non-zero stops
// the call.
struct Interrupt {
  int (*poll)(void* ctx) = nullptr;
  void* ctx = nullptr;
};

// The poll installed on each thread.  Its name has C linkage, so that every
// translation unit (host compilers, nvcc's host pass, each ISA build) links
// to the one variable whatever namespace a header around it has opened.
extern "C" {
inline thread_local Interrupt blochsim_current_interrupt{};
}

// Installs i for the calls this thread makes; returns the previous poll.
inline Interrupt set_interrupt(Interrupt i) noexcept {
  const Interrupt prev = blochsim_current_interrupt;
  blochsim_current_interrupt = i;
  return prev;
}

// Installs a poll for the calls made on this thread while it lives.
class InterruptScope {
 public:
  InterruptScope(int (*poll)(void*), void* ctx) noexcept : prev_(set_interrupt(Interrupt{poll, ctx})) {}
  ~InterruptScope() { set_interrupt(prev_); }
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;

 private:
  Interrupt prev_;
};

// The stop state of one call, shared by its threads: the calling thread
// polls (rate-limited), every thread reads the flag.
class Stop {
 public:
  using clock = std::chrono::steady_clock;
  static constexpr std::chrono::milliseconds poll_interval{20};

  Stop() noexcept : poll_(blochsim_current_interrupt), caller_(std::this_thread::get_id()), last_(clock::now()) {}

  // True once the call should stop.
  bool operator()() noexcept {
    if (flag_.load(std::memory_order_relaxed)) return true;
    if (poll_.poll && std::this_thread::get_id() == caller_) {
      const clock::time_point now = clock::now();
      if (now - last_ >= poll_interval) {
        last_ = now;
        if (poll_.poll(poll_.ctx) != 0) {
          flag_.store(true, std::memory_order_relaxed);
          return true;
        }
      }
    }
    return false;
  }

  // Stops the other threads (one has failed).
  void stop() noexcept { flag_.store(true, std::memory_order_relaxed); }

 private:
  Interrupt poll_;
  std::thread::id caller_;
  clock::time_point last_;
  std::atomic<bool> flag_{false};
};

// Bytes of memory a new allocation can take without swapping: the kernel's
// MemAvailable on Linux, else the free physical pages; SIZE_MAX where
// neither is known.
inline std::size_t available_memory_bytes() noexcept {
#if defined(__linux__)
  if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    unsigned long long kb = 0;
    bool found = false;
    while (std::fgets(line, sizeof line, f)) {
      if (std::strncmp(line, "MemAvailable:", 13) == 0) {
        found = std::sscanf(line + 13, "%llu", &kb) == 1;
        break;
      }
    }
    std::fclose(f);
    if (found) return static_cast<std::size_t>(kb) * 1024;
  }
#endif
#if defined(_SC_AVPHYS_PAGES) && defined(_SC_PAGESIZE)
  const long pages = sysconf(_SC_AVPHYS_PAGES), size = sysconf(_SC_PAGESIZE);
  if (pages > 0 && size > 0) return static_cast<std::size_t>(pages) * static_cast<std::size_t>(size);
#endif
  return static_cast<std::size_t>(-1);
}

// Workspaces of at most this many bytes are not checked (reading the
// kernel's figure costs more than they do); Python's check skips the same.
inline constexpr double unchecked_workspace_bytes = 64.0 * 1024 * 1024;

// Whether a workspace of `bytes` fits.
inline bool workspace_fits(double bytes) noexcept {
  if (bytes <= unchecked_workspace_bytes) return true;
  return bytes <= static_cast<double>(available_memory_bytes());
}

// Runs f() and turns a C++ exception into a status.
template <class F>
inline int guarded(F&& f) noexcept {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return out_of_memory;
  } catch (...) {
    return internal_error;
  }
}

}  // namespace blochsim
