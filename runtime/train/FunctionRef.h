//===- FunctionRef.h - A non-owning reference to a callable --------------===//
//
// What std::function is for a call that does not keep the callable: two pointers, no allocation (a
// std::function holding a lambda that captures more than two pointers allocates it on the heap, and the
// runtime's steady-state calls allocate nothing: issue 4). The callable must outlive the reference, as it
// does when a lambda is passed straight to the function taking the reference.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <memory>
#include <type_traits>
#include <utility>

namespace lmcc {

template <typename Fn> class FunctionRef;

template <typename R, typename... Args> class FunctionRef<R(Args...)> {
public:
  template <typename F, typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, FunctionRef>>>
  FunctionRef(F &&f) noexcept // NOLINT(google-explicit-constructor): lambdas convert at the call
      : object_(const_cast<void *>(static_cast<const void *>(std::addressof(f)))),
        call_([](void *object, Args... args) -> R {
          return (*static_cast<std::remove_reference_t<F> *>(object))(std::forward<Args>(args)...);
        }) {}

  R operator()(Args... args) const { return call_(object_, std::forward<Args>(args)...); }

private:
  void *object_;
  R (*call_)(void *, Args...);
};

} // namespace lmcc
