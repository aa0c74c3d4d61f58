// Private: the coroutine type the ofi algorithms are written in.
//
// A collective is written as straight-line code that posts messages and then
// `co_await`s their completion (or a condition on the host segment). The
// progress engine resumes it when the condition holds; nothing blocks, so one
// engine thread (or a waiting caller) drives every group's ops at once.
//
//   Task ring_step(OpCtx& c, ...) {
//     Request* r = c.recv(...);
//     co_await c.wait(r);                 // suspends until r completes
//     co_await c.until([&] { return flag >= n; });
//     co_await other_task(c, ...);        // nested Task, errors propagate
//   }
//
// Note [Suspension]: a coroutine only suspends inside Until (and Task
// awaits). Until records "how to tell I am ready" in the op's Suspension; the
// engine polls it and resumes the innermost coroutine, which continues its
// parents by symmetric transfer when it finishes. Parameters of a Task
// function are copied into its frame: pass pointers or values, never
// references to temporaries.
#pragma once

#include <array>
#include <coroutine>
#include <cstddef>
#include <vector>
#include <exception>
#include <string>
#include <utility>

namespace torus::comm::ofi {

namespace detail {
// Coroutine frames are small and short-lived (a few per op); a per-thread
// cache of freed frames keeps the allocator out of the latency path.
inline thread_local bool frame_cache_gone = false;  // set when this thread's cache is destroyed

class FrameCache {
 public:
  static constexpr size_t kGranule = 64, kClasses = 64, kKeep = 64;  // frames up to 4 KiB
  ~FrameCache() {
    frame_cache_gone = true;  // frees after this (static destructors) bypass the cache
    for (auto& list : free_) {
      for (void* p : list) ::operator delete(p);
    }
  }
  void* take(size_t n) {
    size_t c = (n + kGranule - 1) / kGranule;
    if (c == 0 || c > kClasses) return ::operator new(n);
    auto& list = free_[c - 1];
    if (list.empty()) return ::operator new(c * kGranule);
    void* p = list.back();
    list.pop_back();
    return p;
  }
  void give(void* p, size_t n) {
    size_t c = (n + kGranule - 1) / kGranule;
    if (c == 0 || c > kClasses || free_[c - 1].size() >= kKeep) {
      ::operator delete(p);
      return;
    }
    free_[c - 1].push_back(p);
  }

 private:
  std::array<std::vector<void*>, kClasses> free_;
};
inline FrameCache& frame_cache() {
  thread_local FrameCache cache;
  return cache;
}
inline void* cache_take(size_t n) { return frame_cache_gone ? ::operator new(n) : frame_cache().take(n); }
inline void cache_give(void* p, size_t n) {
  if (frame_cache_gone) {
    ::operator delete(p);
  } else {
    frame_cache().give(p, n);
  }
}
}  // namespace detail

// A std allocator over the same cache, for the small objects every op
// allocates (its Work and control block).
template <typename T>
struct CachedAllocator {
  using value_type = T;
  CachedAllocator() = default;
  template <typename U>
  CachedAllocator(const CachedAllocator<U>&) noexcept {}
  T* allocate(size_t n) { return static_cast<T*>(detail::cache_take(n * sizeof(T))); }
  void deallocate(T* p, size_t n) noexcept { detail::cache_give(p, n * sizeof(T)); }
  template <typename U>
  bool operator==(const CachedAllocator<U>&) const noexcept {
    return true;
  }
};

// What the suspended op waits for; owned by the op, written by Until.
struct Suspension {
  bool (*ready)(void*) = nullptr;          // null: not suspended on a condition
  std::string (*describe)(void*) = nullptr;  // for timeout messages; may be null
  void* arg = nullptr;
  std::coroutine_handle<> resume;
};

class [[nodiscard]] Task {
 public:
  struct promise_type;
  using Handle = std::coroutine_handle<promise_type>;

  struct FinalAwaiter {
    bool await_ready() const noexcept { return false; }
    std::coroutine_handle<> await_suspend(Handle h) noexcept { return h.promise().continuation; }
    void await_resume() const noexcept {}
  };

  struct promise_type {
    static void* operator new(size_t n) { return detail::cache_take(n); }
    static void operator delete(void* p, size_t n) { detail::cache_give(p, n); }
    std::coroutine_handle<> continuation = std::noop_coroutine();
    std::exception_ptr error;
    Task get_return_object() { return Task(Handle::from_promise(*this)); }
    std::suspend_always initial_suspend() const noexcept { return {}; }
    FinalAwaiter final_suspend() const noexcept { return {}; }
    void return_void() const noexcept {}
    void unhandled_exception() noexcept { error = std::current_exception(); }
  };

  Task() = default;
  Task(Task&& o) noexcept : h_(std::exchange(o.h_, {})) {}
  Task& operator=(Task&& o) noexcept {
    if (this != &o) {
      reset();
      h_ = std::exchange(o.h_, {});
    }
    return *this;
  }
  Task(const Task&) = delete;
  Task& operator=(const Task&) = delete;
  // Destroying a suspended Task destroys its frame and, through the frame's
  // locals, every child Task it is awaiting.
  ~Task() { reset(); }

  // --- as a child: `co_await task` runs it and rethrows its error --------------
  bool await_ready() const noexcept { return false; }
  std::coroutine_handle<> await_suspend(std::coroutine_handle<> parent) noexcept {
    h_.promise().continuation = parent;
    return h_;
  }
  void await_resume() const {
    if (h_.promise().error) std::rethrow_exception(h_.promise().error);
  }

  // --- as the root of an op, driven by the engine --------------------------------
  void start() { h_.resume(); }
  bool valid() const { return static_cast<bool>(h_); }
  bool done() const { return !h_ || h_.done(); }
  std::exception_ptr error() const { return h_ ? h_.promise().error : nullptr; }
  void reset() {
    if (h_) h_.destroy();
    h_ = {};
  }

 private:
  explicit Task(Handle h) : h_(h) {}
  Handle h_;
};

// Suspends until pred() is true (checked at once, then by the engine).
// `pred` may throw; the op then fails with that exception. `describe`, when
// given, says what is awaited for timeout messages.
template <typename Pred, typename Describe = std::nullptr_t>
class [[nodiscard]] Until {
 public:
  Until(Suspension& s, Pred pred, Describe describe = nullptr)
      : s_(s), pred_(std::move(pred)), describe_(std::move(describe)) {}

  bool await_ready() { return pred_(); }
  void await_suspend(std::coroutine_handle<> h) {
    s_.ready = &Until::call;
    s_.arg = this;
    s_.resume = h;
    if constexpr (std::is_same_v<Describe, std::nullptr_t>) {
      s_.describe = nullptr;
    } else {
      s_.describe = &Until::call_describe;
    }
  }
  void await_resume() const noexcept {}

 private:
  static bool call(void* self) { return static_cast<Until*>(self)->pred_(); }
  static std::string call_describe(void* self) {
    if constexpr (std::is_same_v<Describe, std::nullptr_t>) {
      return {};
    } else {
      return static_cast<Until*>(self)->describe_();
    }
  }

  Suspension& s_;
  Pred pred_;
  Describe describe_;
};

}  // namespace torus::comm::ofi
