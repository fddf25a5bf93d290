// A non-owning reference to a callable (like C++26's std::function_ref): type erasure for a
// callback that is only called while the caller's frame is alive, with no allocation.
#pragma once

#include <functional>
#include <memory>
#include <type_traits>
#include <utility>

namespace kiln {

template <class Sig> class FunctionRef;

template <class R, class... A>
class FunctionRef<R(A...)> {
public:
    template <class F>
        requires(!std::is_same_v<std::remove_cvref_t<F>, FunctionRef> && std::is_invocable_r_v<R, F&, A...>)
    FunctionRef(F&& f) noexcept  // NOLINT(google-explicit-constructor): binds like a function parameter
        : obj_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
          call_([](void* o, A... a) -> R { return std::invoke(*static_cast<std::remove_reference_t<F>*>(o), std::forward<A>(a)...); }) {}

    R operator()(A... a) const { return call_(obj_, std::forward<A>(a)...); }

private:
    void* obj_;
    R (*call_)(void*, A...);
};

}  // namespace kiln
