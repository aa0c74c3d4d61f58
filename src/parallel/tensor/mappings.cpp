// Region mappings of tensor and sequence parallelism (mappings.h): each one a
// custom autograd function whose forward and backward are conjugate
// collectives over the TP group.
#include "torus/parallel/tensor/mappings.h"

#include <ATen/Functions.h>
#include <torch/csrc/autograd/custom_function.h>

#include "core/log.h"
#include "parallel/tensor/group_capsule.h"
#include "torus/parallel/groups.h"

namespace torus::tp {
namespace {

using parallel::group_rank;
using parallel::group_size;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

int64_t wrap_dim(int64_t dim, const at::Tensor& x) {
  const int64_t n = x.dim();
  TORUS_CHECK(n > 0, InvalidArgument, "tensor-parallel mapping of a 0-d tensor");
  TORUS_CHECK(dim >= -n && dim < n, InvalidArgument, "dimension {} out of range for a {}-d tensor", dim, n);
  return dim < 0 ? dim + n : dim;
}

using detail::comm_alias;

void check_divisible(const at::Tensor& x, int64_t dim, int n, const char* what) {
  TORUS_CHECK(x.size(dim) % n == 0, InvalidArgument,
              "{}: dimension {} of size {} is not divisible by the group size {} (shape [{}])", what, dim, x.size(dim),
              n, fmt::join(x.sizes(), ", "));
}

// --- the mappings -------------------------------------------------------------------
// Each forward gets the group as an argument and stores it for backward; the
// group argument receives no gradient (an undefined tensor in its slot).

struct CopyToTp : torch::autograd::Function<CopyToTp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const comm::ProcessGroupPtr& g) {
    ctx->saved_data["g"] = detail::pack_group(g);
    return x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {all_reduce_sum(grads[0], detail::unpack_group(ctx->saved_data["g"])), at::Tensor()};
  }
};

struct ReduceFromTp : torch::autograd::Function<ReduceFromTp> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x, const comm::ProcessGroupPtr& g) {
    return all_reduce_sum(x, g);
  }
  static variable_list backward(AutogradContext*, variable_list grads) { return {grads[0], at::Tensor()}; }
};

struct ScatterToTp : torch::autograd::Function<ScatterToTp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const comm::ProcessGroupPtr& g) {
    ctx->saved_data["g"] = detail::pack_group(g);
    return split_along(x, -1, g);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {all_gather_along(grads[0], -1, detail::unpack_group(ctx->saved_data["g"])), at::Tensor()};
  }
};

struct GatherFromTp : torch::autograd::Function<GatherFromTp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const comm::ProcessGroupPtr& g) {
    ctx->saved_data["g"] = detail::pack_group(g);
    return all_gather_along(x, -1, g);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {split_along(grads[0], -1, detail::unpack_group(ctx->saved_data["g"])), at::Tensor()};
  }
};

struct ScatterToSequence : torch::autograd::Function<ScatterToSequence> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const comm::ProcessGroupPtr& g) {
    ctx->saved_data["g"] = detail::pack_group(g);
    return split_along(x, 0, g);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {all_gather_along(grads[0], 0, detail::unpack_group(ctx->saved_data["g"])), at::Tensor()};
  }
};

struct GatherFromSequence : torch::autograd::Function<GatherFromSequence> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const comm::ProcessGroupPtr& g,
                            bool partial_grad) {
    ctx->saved_data["g"] = detail::pack_group(g);
    ctx->saved_data["partial"] = partial_grad;
    return all_gather_along(x, 0, g);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto g = detail::unpack_group(ctx->saved_data["g"]);
    at::Tensor dx =
        ctx->saved_data["partial"].toBool() ? reduce_scatter_along(grads[0], 0, g) : split_along(grads[0], 0, g);
    return {dx, at::Tensor(), at::Tensor()};
  }
};

struct ReduceScatterToSequence : torch::autograd::Function<ReduceScatterToSequence> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const comm::ProcessGroupPtr& g) {
    ctx->saved_data["g"] = detail::pack_group(g);
    return reduce_scatter_along(x, 0, g);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {all_gather_along(grads[0], 0, detail::unpack_group(ctx->saved_data["g"])), at::Tensor()};
  }
};

}  // namespace

// --- plain collectives ----------------------------------------------------------------

at::Tensor all_gather_along(const at::Tensor& x, int64_t dim, const comm::ProcessGroupPtr& group) {
  const int n = group_size(group);
  dim = wrap_dim(dim, x);
  if (n == 1) return x;
  // Gathering along dim 0 of a contiguous tensor is one flat all_gather; any
  // other dimension is moved to the front and back (one copy each way).
  at::Tensor front = comm_alias(x.movedim(dim, 0).contiguous());
  std::vector<int64_t> shape = front.sizes().vec();
  shape[0] *= n;
  at::Tensor out = at::empty(shape, front.options());
  group->all_gather(front, out)->wait();
  return dim == 0 ? out : out.movedim(0, dim).contiguous();
}

at::Tensor reduce_scatter_along(const at::Tensor& x, int64_t dim, const comm::ProcessGroupPtr& group) {
  const int n = group_size(group);
  dim = wrap_dim(dim, x);
  if (n == 1) return x;
  check_divisible(x, dim, n, "reduce-scatter");
  at::Tensor front = comm_alias(x.movedim(dim, 0).contiguous());
  std::vector<int64_t> shape = front.sizes().vec();
  shape[0] /= n;
  at::Tensor out = at::empty(shape, front.options());
  group->reduce_scatter(front, out)->wait();
  return dim == 0 ? out : out.movedim(0, dim).contiguous();
}

at::Tensor split_along(const at::Tensor& x, int64_t dim, const comm::ProcessGroupPtr& group) {
  const int n = group_size(group);
  dim = wrap_dim(dim, x);
  if (n == 1) return x;
  check_divisible(x, dim, n, "split");
  const int64_t chunk = x.size(dim) / n;
  return x.narrow(dim, group_rank(group) * chunk, chunk).contiguous();
}

at::Tensor all_reduce_sum(const at::Tensor& x, const comm::ProcessGroupPtr& group) {
  if (group_size(group) == 1) return x;
  at::Tensor in = comm_alias(x.contiguous());
  at::Tensor out = at::empty_like(in);
  group->all_reduce(in, out)->wait();
  return out;
}

// --- autograd entry points --------------------------------------------------------------

at::Tensor copy_to_tp_region(const at::Tensor& x, const comm::ProcessGroupPtr& group) {
  return group_size(group) == 1 ? x : CopyToTp::apply(x, group);
}

at::Tensor reduce_from_tp_region(const at::Tensor& x, const comm::ProcessGroupPtr& group) {
  return group_size(group) == 1 ? x : ReduceFromTp::apply(x, group);
}

at::Tensor scatter_to_tp_region(const at::Tensor& x, const comm::ProcessGroupPtr& group) {
  return group_size(group) == 1 ? x : ScatterToTp::apply(x, group);
}

at::Tensor gather_from_tp_region(const at::Tensor& x, const comm::ProcessGroupPtr& group) {
  return group_size(group) == 1 ? x : GatherFromTp::apply(x, group);
}

at::Tensor scatter_to_sequence_region(const at::Tensor& x, const comm::ProcessGroupPtr& group) {
  return group_size(group) == 1 ? x : ScatterToSequence::apply(x, group);
}

at::Tensor gather_from_sequence_region(const at::Tensor& x, const comm::ProcessGroupPtr& group, bool partial_grad) {
  return group_size(group) == 1 ? x : GatherFromSequence::apply(x, group, partial_grad);
}

at::Tensor reduce_scatter_to_sequence_region(const at::Tensor& x, const comm::ProcessGroupPtr& group) {
  return group_size(group) == 1 ? x : ReduceScatterToSequence::apply(x, group);
}

}  // namespace torus::tp
