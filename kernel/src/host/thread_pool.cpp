// The persistent worker threads of one layer.
#include "host/thread_pool.hpp"

namespace mok::host {

void ThreadPool::start(int workers, int limit) {
  wanted_ = workers;
  ready_ = pthread_mutex_init(&mutex_, nullptr) == 0;
  ready_ = ready_ && pthread_cond_init(&wake_, nullptr) == 0 && pthread_cond_init(&done_, nullptr) == 0;
  if (!ready_) return;  // no threads: the calling thread is the only worker
  int n = limit >= 0 && limit < workers ? limit : workers;
  for (int i = 0; i < n; ++i) {
    seat_[i] = Seat{this, i};
    if (pthread_create(&thread_[i], nullptr, thread_main, &seat_[i]) != 0) break;
    // Named before the layer exists, so that tools (and tests) tell its threads apart.
    pthread_setname_np(thread_[i], kThreadName);
    threads_ = i + 1;
  }
}

ThreadPool::~ThreadPool() {
  if (!ready_) return;
  pthread_mutex_lock(&mutex_);
  stopping_ = true;
  pthread_cond_broadcast(&wake_);
  pthread_mutex_unlock(&mutex_);
  for (int i = 0; i < threads_; ++i) pthread_join(thread_[i], nullptr);
  pthread_cond_destroy(&done_);
  pthread_cond_destroy(&wake_);
  pthread_mutex_destroy(&mutex_);
}

void* ThreadPool::thread_main(void* seat) {
  auto* s = static_cast<Seat*>(seat);
  s->pool->serve(s->index);
  return nullptr;
}

void ThreadPool::serve(int index) {
  unsigned long long seen = 0;
  pthread_mutex_lock(&mutex_);
  for (;;) {
    while (round_ == seen && !stopping_) pthread_cond_wait(&wake_, &mutex_);
    if (stopping_) break;
    seen = round_;
    Body body = body_;
    void* job = job_;
    pthread_mutex_unlock(&mutex_);
    body(job, index);
    pthread_mutex_lock(&mutex_);
    if (--busy_ == 0) pthread_cond_signal(&done_);
  }
  pthread_mutex_unlock(&mutex_);
}

void ThreadPool::run(Body body, void* job) {
  if (ready_) {
    pthread_mutex_lock(&mutex_);
    body_ = body;
    job_ = job;
    busy_ = threads_;
    ++round_;
    pthread_cond_broadcast(&wake_);
    pthread_mutex_unlock(&mutex_);
  }
  if (threads_ < wanted_) body(job, threads_);
  if (!ready_) return;
  pthread_mutex_lock(&mutex_);
  while (busy_ > 0) pthread_cond_wait(&done_, &mutex_);
  pthread_mutex_unlock(&mutex_);
}

}  // namespace mok::host
