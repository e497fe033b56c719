// The extension's entries (calls.hpp): each operation's one entry picks the
// host dispatch or the device launcher by the Call's place.
#include "calls.hpp"

#include "dispatch.hpp"
#include "launcher.hpp"

namespace blochsim {

int call_forward(const Call& c) noexcept {
  const EventStream& s = *c.stream;
  const Tissue& t = *c.tissue;
  switch (c.place) {
    case on_host:
      if (c.program) return host_keyed_dispatch(s, *c.program, t, c.out, c.threads);
      if (c.variant) return host_forward_registers(s, t, c.out, c.variant);
      return host_forward_dispatch(s, t, c.out, c.threads);
    case on_device:
      if (c.program) return cuda::keyed_forward(s, *c.program, t, c.out, c.cuda_stream, c.err, c.err_len);
      return cuda::forward(s, t, c.out, c.cuda_stream, c.err, c.err_len, c.kept);
    case through_device:
      return cuda::forward_streamed(s, t, c.out, c.budget_bytes, c.err, c.err_len);
  }
  return bad_shape;
}

int call_jacobian(const Call& c) noexcept {
  const EventStream& s = *c.stream;
  const Tissue& t = *c.tissue;
  switch (c.place) {
    case on_host:
      if (c.program)
        return host_keyed_jacobian_dispatch(s, *c.program, t, c.fields, c.n_dirs, c.out, c.jac, c.threads, c.seeds);
      if (c.variant) return host_jacobian_registers(s, t, c.fields, c.n_dirs, c.out, c.jac, c.seeds, c.variant);
      return host_jacobian_dispatch(s, t, c.fields, c.n_dirs, c.out, c.jac, c.threads, c.seeds);
    case on_device:
      return cuda::jacobian(s, t, c.fields, c.seeds, c.n_dirs, c.out, c.jac, c.cuda_stream, c.err, c.err_len);
  }
  return bad_shape;
}

int call_adjoint(const Call& c) noexcept {
  const EventStream& s = *c.stream;
  const Tissue& t = *c.tissue;
  switch (c.place) {
    case on_host:
      return host_adjoint_dispatch(s, t, c.fields, c.n_dirs, c.cot, c.ev_grad, c.tgrad, c.threads);
    case on_device:
      return cuda::adjoint(s, t, c.fields, c.n_dirs, c.cot, c.ev_grad, c.tgrad, c.cuda_stream, c.err, c.err_len);
  }
  return bad_shape;
}

int call_adjoint2(const Call& c) noexcept {
  const EventStream& s = *c.stream;
  const Tissue& t = *c.tissue;
  switch (c.place) {
    case on_host:
      return host_adjoint2_dispatch(s, t, c.outer_field, c.cot, c.cot_stride, c.ev_grad, c.threads);
    case on_device:
      return cuda::adjoint2(s, t, c.outer_field, c.cot, c.cot_stride, c.ev_grad, c.cuda_stream, c.err, c.err_len);
  }
  return bad_shape;
}

int call_pooled(const Call& c) noexcept {
  const EventStream& s = *c.stream;
  const Tissue& t = *c.tissue;
  const Pools& p = *c.pools;
  switch (c.place) {
    case on_host:
      if (c.program)
        return host_keyed_pooled_dispatch(s, *c.program, t, p, c.fields, c.n_dirs, c.seeds, c.out, c.jac,
                                          c.threads);
      if (c.variant) return host_pooled_registers(s, t, p, c.out);
      return host_pooled_dispatch(s, t, p, c.fields, c.n_dirs, c.seeds, c.out, c.jac, c.threads);
    case on_device:
      return cuda::pooled_resident(s, t, p, c.fields, c.n_dirs, c.seeds, c.out, c.jac, c.cuda_stream, c.err,
                                   c.err_len);
    case through_device:
      return cuda::pooled(s, t, p, c.fields, c.n_dirs, c.seeds, c.out, c.jac, c.err, c.err_len);
  }
  return bad_shape;
}

int call_pooled_adjoint(const Call& c) noexcept {
  const EventStream& s = *c.stream;
  const Tissue& t = *c.tissue;
  const Pools& p = *c.pools;
  switch (c.place) {
    case on_host:
      return host_pooled_adjoint_dispatch(s, t, p, c.fields, c.n_dirs, c.cot, c.ev_grad, c.tgrad, c.threads, c.mask);
    case on_device:
      return cuda::pooled_adjoint_resident(s, t, p, c.fields, c.n_dirs, c.cot, c.ev_grad, c.tgrad, c.mask,
                                           c.cuda_stream, c.err, c.err_len);
    case through_device:
      return cuda::pooled_adjoint(s, t, p, c.fields, c.n_dirs, c.cot, c.ev_grad, c.tgrad, c.mask, c.err, c.err_len);
  }
  return bad_shape;
}

}  // namespace blochsim
