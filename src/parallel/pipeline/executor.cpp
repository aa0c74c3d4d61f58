// The pipeline executor: one rank's actions of a validated schedule, run in
// order, with activations and gradients moved by ProcessGroup send/recv.
// Contracts, Note [Shape agreement] and Note [Pipeline tags] in
// include/torus/parallel/pipeline/executor.h.
#include "torus/parallel/pipeline/executor.h"

#include <ATen/Functions.h>

#include <algorithm>
#include <chrono>
#include <optional>

#include "core/log.h"

namespace torus::pp {

namespace {

// Header of Note [Shape agreement]: [dtype, ndim, size_0 .. size_{ndim-1}],
// padded to a fixed length so that the receiver can post it blindly.
constexpr int kMaxDims = 8;
constexpr int kHeaderLength = 2 + kMaxDims;

using Clock = std::chrono::steady_clock;

std::string spec_string(const TensorSpec& s) {
  return fmt::format("[{}] {}", fmt::join(s.sizes, ", "), c10::toString(s.dtype));
}

bool matches(const TensorSpec& s, const at::Tensor& t) {
  return t.scalar_type() == s.dtype && t.sizes().vec() == s.sizes;
}

// A receive posted (ahead of time, Note on recv_prefetch) for one action.
struct PostedRecv {
  comm::WorkPtr work;
  at::Tensor tensor;
};

}  // namespace

at::Tensor StageCallbacks::loss(int /*micro*/, const at::Tensor& output) {
  return output;
}

at::Tensor StageCallbacks::backward(int micro, int chunk, const at::Tensor& grad_output) {
  at::Tensor grad_input = backward_input(micro, chunk, grad_output);
  backward_weight(micro, chunk);
  return grad_input;
}

struct PipelineExecutor::EdgeState {
  std::optional<TensorSpec> spec;  // known: declared, sent once, or received once
};

PipelineExecutor::PipelineExecutor(comm::ProcessGroupPtr group, ExecutorOptions options)
    : group_(std::move(group)), options_(std::move(options)) {
  TORUS_CHECK(group_ != nullptr, InvalidArgument, "PipelineExecutor: the pipeline group is null");
  TORUS_CHECK(options_.recv_prefetch >= 0, InvalidArgument, "PipelineExecutor: recv_prefetch must be >= 0, got {}",
              options_.recv_prefetch);
  for (const auto& s : options_.edge_specs) {
    TORUS_CHECK(s.sizes.size() <= kMaxDims, InvalidArgument, "PipelineExecutor: edge spec {} has more than {} dims",
                spec_string(s), kMaxDims);
  }
}

PipelineExecutor::~PipelineExecutor() = default;

namespace {

// One step of one rank: the state that lives for a single run().
class Step {
 public:
  Step(const Schedule& s, comm::ProcessGroup& group, const ExecutorOptions& options, StageCallbacks& cb,
       std::vector<std::optional<TensorSpec>*> specs)
      : s_(s),
        g_(group),
        o_(options),
        cb_(cb),
        specs_(std::move(specs)),
        rank_(group.rank()),
        list_(s.actions[rank_]),
        slots_(size_t(s.num_micro) * s.num_chunks),
        posted_(list_.size()),
        start_(Clock::now()) {
    if (s_.is_last_stage(rank_, s_.num_chunks - 1)) result_.losses.resize(s_.num_micro);
    result_.origin = std::chrono::duration<double>(start_.time_since_epoch()).count();
  }

  StepResult run() {
    for (size_t i = 0; i < list_.size(); ++i) {
      prefetch(i);
      const double t0 = seconds();
      execute(i);
      if (o_.record_trace) result_.trace.push_back({list_[i], t0, seconds()});
      reap_sends();
    }
    for (auto& w : sends_) w->wait();
    sends_.clear();
    result_.wall = seconds();
    return std::move(result_);
  }

 private:
  // Tensors of one (micro, chunk) between the actions that make and use them.
  struct Slot {
    at::Tensor input;        // received activation, until Forward
    at::Tensor output;       // forward output, until SendActivation
    at::Tensor grad_output;  // received gradient, until Backward/BackwardInput
    at::Tensor grad_input;   // input gradient, until SendGrad
  };

  double seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  Slot& slot(const Action& a) { return slots_[size_t(a.micro) * s_.num_chunks + a.chunk]; }
  int stage(const Action& a) const { return s_.stage(rank_, a.chunk); }
  int edges() const { return s_.num_stages() - 1; }
  int edge_of(const Action& a) const {
    const bool towards_next = a.kind == ActionKind::kSendActivation || a.kind == ActionKind::kRecvGrad;
    return towards_next ? stage(a) : stage(a) - 1;
  }
  int data_tag(const Action& a) const {
    const bool grad = a.kind == ActionKind::kSendGrad || a.kind == ActionKind::kRecvGrad;
    return edges() + 2 * (a.micro * edges() + edge_of(a)) + (grad ? 1 : 0);
  }
  std::string where(const Action& a) const {
    return fmt::format("pipeline rank {} (stage {}), {}", rank_, stage(a), a.describe());
  }
  comm::SendRecvOptions opts(int tag) const { return comm::SendRecvOptions{tag, o_.timeout}; }

  template <typename Fn>
  void timed(Fn&& fn) {
    const double t0 = seconds();
    fn();
    result_.busy += seconds() - t0;
  }

  void execute(size_t i) {
    const Action& a = list_[i];
    Slot& sl = slot(a);
    switch (a.kind) {
      case ActionKind::kForward: {
        at::Tensor out;
        timed([&] { out = cb_.forward(a.micro, a.chunk, sl.input); });
        sl.input = at::Tensor();
        result_.peak_live = std::max(result_.peak_live, ++live_);
        if (s_.is_last_stage(rank_, a.chunk)) {
          at::Tensor loss;
          timed([&] { loss = cb_.loss(a.micro, out); });
          TORUS_CHECK(loss.defined() && loss.numel() == 1, InvalidArgument,
                      "{}: loss() must return a one-element tensor", where(a));
          result_.losses[a.micro] = loss.detach();
        } else {
          TORUS_CHECK(out.defined(), InvalidArgument, "{}: forward returned no activation", where(a));
          sl.output = std::move(out);
        }
        return;
      }
      case ActionKind::kBackward:
      case ActionKind::kBackwardInput: {
        at::Tensor grad_in;
        const bool fused = a.kind == ActionKind::kBackward;
        timed([&] {
          grad_in = fused ? cb_.backward(a.micro, a.chunk, sl.grad_output)
                          : cb_.backward_input(a.micro, a.chunk, sl.grad_output);
        });
        if (fused) --live_;
        sl.grad_output = at::Tensor();
        if (!s_.is_first_stage(rank_, a.chunk)) {
          TORUS_CHECK(grad_in.defined(), InvalidArgument, "{}: the backward returned no input gradient", where(a));
          sl.grad_input = std::move(grad_in);
        }
        return;
      }
      case ActionKind::kBackwardWeight:
        timed([&] { cb_.backward_weight(a.micro, a.chunk); });
        --live_;
        return;
      case ActionKind::kSendActivation:
        send(a, std::exchange(sl.output, at::Tensor()));
        return;
      case ActionKind::kSendGrad:
        send(a, std::exchange(sl.grad_input, at::Tensor()));
        return;
      case ActionKind::kRecvActivation:
      case ActionKind::kRecvGrad: {
        if (!posted_[i]) post_recv(i);
        PostedRecv r = std::move(*posted_[i]);
        posted_[i].reset();
        r.work->wait();
        (a.kind == ActionKind::kRecvActivation ? sl.input : sl.grad_output) = std::move(r.tensor);
        return;
      }
    }
  }

  void send(const Action& a, at::Tensor t) {
    auto& spec = *specs_[edge_of(a)];
    if (!spec) {  // first activation on this edge: agree on its shape
      TORUS_CHECK(t.dim() <= kMaxDims, InvalidArgument, "{}: activations of more than {} dims are not supported",
                  where(a), kMaxDims);
      spec = TensorSpec{t.sizes().vec(), t.scalar_type()};
      at::Tensor header = at::zeros({kHeaderLength}, at::kLong);
      auto h = header.accessor<int64_t, 1>();
      h[0] = static_cast<int64_t>(comm::to_dtype(t.scalar_type()));
      h[1] = t.dim();
      for (int64_t d = 0; d < t.dim(); ++d) h[2 + d] = t.size(d);
      sends_.push_back(g_.send(header, a.peer, opts(edge_of(a))));
    }
    TORUS_CHECK(matches(*spec, t), InvalidArgument,
                "{}: the {} is {} but edge {} (stage {} -> {}) carries {} (Note [Shape agreement])", where(a),
                a.kind == ActionKind::kSendGrad ? "input gradient" : "activation",
                spec_string({t.sizes().vec(), t.scalar_type()}), edge_of(a), edge_of(a), edge_of(a) + 1,
                spec_string(*spec));
    if (t.device() != o_.device) t = t.to(o_.device);
    sends_.push_back(g_.send(t.contiguous(), a.peer, opts(data_tag(a))));
  }

  // Posts the receive of action i; false if its edge's spec is not known yet
  // (and `blocking` is false). With `blocking`, first receives the header.
  bool post_recv(size_t i, bool blocking = true) {
    const Action& a = list_[i];
    auto& spec = *specs_[edge_of(a)];
    if (!spec) {
      if (!blocking) return false;
      at::Tensor header = at::zeros({kHeaderLength}, at::kLong);
      g_.recv(header, a.peer, opts(edge_of(a)))->wait();
      auto h = header.accessor<int64_t, 1>();
      TORUS_CHECK(h[1] >= 0 && h[1] <= kMaxDims, CommError, "{}: corrupt shape header from rank {} (ndim {})", where(a),
                  a.peer, h[1]);
      TensorSpec got{{}, comm::to_scalar_type(static_cast<DType>(h[0]))};
      for (int64_t d = 0; d < h[1]; ++d) got.sizes.push_back(h[2 + d]);
      spec = std::move(got);
    }
    at::Tensor buf = at::empty(spec->sizes, at::TensorOptions().dtype(spec->dtype).device(o_.device));
    posted_[i] = PostedRecv{g_.recv(buf, a.peer, opts(data_tag(a))), buf};
    return true;
  }

  // Keeps up to recv_prefetch receives after action i posted.
  void prefetch(size_t i) {
    if (o_.recv_prefetch == 0) return;
    next_prefetch_ = std::max(next_prefetch_, i + 1);
    int ahead = 0;
    for (size_t j = i + 1; j < next_prefetch_; ++j) ahead += posted_[j].has_value() ? 1 : 0;
    while (ahead < o_.recv_prefetch && next_prefetch_ < list_.size()) {
      if (is_recv(list_[next_prefetch_].kind)) {
        if (!post_recv(next_prefetch_, /*blocking=*/false)) return;  // retry once the spec is known
        ++ahead;
      }
      ++next_prefetch_;
    }
  }

  void reap_sends() {
    std::erase_if(sends_, [](const comm::WorkPtr& w) {
      if (!w->is_completed()) return false;
      w->wait();  // rethrows a failure
      return true;
    });
  }

  const Schedule& s_;
  comm::ProcessGroup& g_;
  const ExecutorOptions& o_;
  StageCallbacks& cb_;
  std::vector<std::optional<TensorSpec>*> specs_;  // per edge
  const int rank_;
  const std::vector<Action>& list_;
  std::vector<Slot> slots_;
  std::vector<std::optional<PostedRecv>> posted_;  // per action index
  std::vector<comm::WorkPtr> sends_;
  size_t next_prefetch_ = 0;
  int live_ = 0;
  StepResult result_;
  Clock::time_point start_;
};

}  // namespace

StepResult PipelineExecutor::run(const Schedule& schedule, StageCallbacks& callbacks) {
  TORUS_CHECK(schedule.num_ranks == group_->size(), InvalidArgument,
              "PipelineExecutor: {} is for {} ranks but the pipeline group '{}' has {}", schedule.describe(),
              schedule.num_ranks, group_->name(), group_->size());
  check_schedule(schedule);
  const int num_edges = schedule.num_stages() - 1;
  if (schedule.num_stages() != num_stages_) {
    const auto& declared = options_.edge_specs;
    TORUS_CHECK(declared.empty() || declared.size() == 1 || static_cast<int>(declared.size()) == num_edges,
                InvalidArgument, "PipelineExecutor: {} edge specs given for {} edges ({} stages)", declared.size(),
                num_edges, schedule.num_stages());
    edges_.assign(std::max(num_edges, 0), EdgeState{});
    for (int e = 0; e < num_edges && !declared.empty(); ++e) edges_[e].spec = declared[declared.size() == 1 ? 0 : e];
    num_stages_ = schedule.num_stages();
  }
  std::vector<std::optional<TensorSpec>*> specs;
  for (auto& e : edges_) specs.push_back(&e.spec);
  TORUS_LOG_DEBUG("pipeline rank {}: running {}", group_->rank(), schedule.describe());
  return Step(schedule, *group_, options_, callbacks, std::move(specs)).run();
}

}  // namespace torus::pp
