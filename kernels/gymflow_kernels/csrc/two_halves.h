// Shared by kernels that split a call's work in two halves (ppo_grad.cpp): `both(threads, first, second)` runs
// `first` on the calling thread and offers `second` to a per-process helper thread, or runs both in turn on one
// core. A file of its own because the hand-off (who takes the second half, how long the helper spins, what a fork
// or a second calling thread does) is a job apart from any kernel's arithmetic. The calling Python decides the
// thread count with `gymflow_kernels.using_cores`. Included as text by gymflow_kernels.native.cpp_source.
#pragma once

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

// A second thread that may take the second half of a kernel's work while the calling thread does the first (in
// `ppo_grad`: the critic beside the actor; the two halves share no buffer and each sums in the order it would alone, so
// the result is the same to the bit whoever runs which half). Whoever is free first runs the offered half: the helper
// if it is awake, else the caller once its own half is done. So a helper that another process keeps off its core never
// holds the update up: with a strict hand-off, a quick update (160 minibatches of 512) beside a process busy 30% of the
// time took 0.21-0.25 s against 0.15-0.18 s on one core; this way 0.136-0.142 s (0.110-0.114 s on a quiet machine). It
// pays where a core is free (see `gymflow_kernels.native.using_cores`). The helper spins up to a millisecond before it
// sleeps: the halves come tens of microseconds apart and the next minibatch's ~0.3 ms later, and waking a sleeping
// thread costs about a half (with a 0.3 ms spin the quiet update took 0.12-0.17 s).
static inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();  // tells the core this is a spin: less power, and no memory-order flush on exit
#else
  std::this_thread::yield();
#endif
}

class Helper {
 public:
  // Offers `task` (which must outlive the matching `finish`) to the helper thread.
  void offer(const std::function<void()>* task) {
    task_ = task;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      state_.store(kOffered, std::memory_order_release);
    }
    wake_.notify_all();
  }

  // Returns once the offered task has run: here, if the helper has not taken it yet, else on the helper.
  void finish() {
    int offered = kOffered;
    if (state_.compare_exchange_strong(offered, kIdle, std::memory_order_acq_rel)) {
      (*task_)();
      return;
    }
    spin_until(kDone, std::chrono::microseconds(300));
    if (state_.load(std::memory_order_acquire) != kDone) {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [this] { return state_.load(std::memory_order_acquire) == kDone; });
    }
    state_.store(kIdle, std::memory_order_relaxed);
  }

  // This process's helper, started on first use; a forked child (which inherits no threads) starts its own.
  static Helper& get() {
    static Helper* helper = nullptr;
    static pid_t owner = 0;
    if (helper == nullptr || owner != getpid()) {
      helper = new Helper();  // never freed: it lives as long as the process (a forked child's copy is leaked)
      owner = getpid();
    }
    return *helper;
  }

 private:
  static constexpr int kIdle = 0, kOffered = 1, kTaken = 2, kDone = 3;

  Helper() { std::thread([this] { loop(); }).detach(); }

  void spin_until(int wanted, std::chrono::microseconds limit) const {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (state_.load(std::memory_order_acquire) != wanted) {
      for (int i = 0; i < 64 && state_.load(std::memory_order_relaxed) != wanted; ++i) cpu_relax();
      if (std::chrono::steady_clock::now() > deadline) return;
    }
  }

  void loop() {
    for (;;) {
      spin_until(kOffered, std::chrono::microseconds(1000));
      if (state_.load(std::memory_order_acquire) != kOffered) {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [this] { return state_.load(std::memory_order_acquire) == kOffered; });
      }
      int offered = kOffered;
      if (!state_.compare_exchange_strong(offered, kTaken, std::memory_order_acq_rel)) continue;  // taken back
      (*task_)();
      {
        std::lock_guard<std::mutex> lock(mutex_);
        state_.store(kDone, std::memory_order_release);
      }
      wake_.notify_all();
    }
  }

  const std::function<void()>* task_ = nullptr;
  std::atomic<int> state_{kIdle};
  std::mutex mutex_;
  std::condition_variable wake_;
};

// One caller at a time offers work to the helper (which holds one task); a caller that finds it taken, from another
// thread of the process, runs both halves itself.
static std::mutex helper_in_use;

// Runs `first` here and offers `second` to the helper when `threads` > 1; else both here, `first` first.
static void both(std::int64_t threads, const std::function<void()>& first, const std::function<void()>& second) {
  std::unique_lock<std::mutex> lock(helper_in_use, std::defer_lock);
  if (threads < 2 || !lock.try_lock()) {
    first();
    second();
    return;
  }
  Helper& helper = Helper::get();
  helper.offer(&second);
  first();
  helper.finish();
}
