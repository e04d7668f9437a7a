// The host executor's workers: one persistent thread per worker, started with the layer and joined
// when it is destroyed. Between passes the threads block on a condition variable.
#pragma once

#include <pthread.h>

namespace mok::host {

constexpr int kMaxWorkers = 64 + 256;              // comm + compute workers a config may ask for
constexpr const char* kThreadName = "mok-worker";  // every worker thread's name (/proc/<pid>/task/<tid>/comm)

class ThreadPool {
 public:
  using Body = void (*)(void* job, int worker);

  ThreadPool() = default;
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  ~ThreadPool();

  // Start up to `workers` threads (at most `limit`, for tests of the fallback; < 0: no limit). A
  // thread that cannot be created (thread limit) leaves fewer: see workers().
  void start(int workers, int limit);

  // Workers a pass can run at once: one per thread, plus the calling thread when threads are missing.
  int workers() const { return threads_ < wanted_ ? threads_ + 1 : wanted_; }

  // body(job, w) for w in [0, workers()) at once: worker w on thread w, the last on the calling thread
  // when threads are missing. Returns once every body has returned.
  void run(Body body, void* job);

 private:
  struct Seat {
    ThreadPool* pool;
    int index;
  };
  static void* thread_main(void* seat);
  void serve(int index);

  // Plain arrays, not std containers: their template instances would be exported from libmok.
  pthread_t thread_[kMaxWorkers];
  Seat seat_[kMaxWorkers];
  int threads_ = 0, wanted_ = 0;
  bool ready_ = false;  // the mutex and condition variables exist
  pthread_mutex_t mutex_;
  pthread_cond_t wake_, done_;
  // Guarded by mutex_:
  unsigned long long round_ = 0;  // passes started; a thread runs each round once
  int busy_ = 0;                  // threads still in the current round
  bool stopping_ = false;
  Body body_ = nullptr;
  void* job_ = nullptr;
};

}  // namespace mok::host
