// Bucket planning and the all-reduce bucket step (buckets.h).
#include "torus/parallel/data/buckets.h"

#include <algorithm>
#include <map>

#include "core/log.h"

namespace torus::dp {

std::vector<BucketPlan> plan_buckets(const std::vector<ParamDesc>& params, const BucketPlanOptions& options) {
  TORUS_CHECK(options.cap_bytes > 0 && options.first_cap_bytes > 0, InvalidArgument,
              "bucket caps must be > 0 bytes (cap {}, first cap {})", options.cap_bytes, options.first_cap_bytes);
  TORUS_CHECK(options.pad_to_multiple >= 1, InvalidArgument, "bucket pad_to_multiple must be >= 1, got {}",
              options.pad_to_multiple);
  struct Open {
    BucketPlan plan;
    int64_t bytes = 0;
    bool had_first = false;  // this key's (small) first bucket is closed already
  };
  std::map<int, Open> open;
  std::vector<BucketPlan> done;
  auto close = [&](Open& o) {
    const int64_t m = options.pad_to_multiple;
    o.plan.numel = (o.plan.numel + m - 1) / m * m;
    done.push_back(std::move(o.plan));
    o.plan = BucketPlan{};
    o.bytes = 0;
    o.had_first = true;
  };
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamDesc& p = params[i];
    TORUS_CHECK(p.numel >= 0 && p.element_size > 0, InvalidArgument, "parameter {}: numel {} element size {}", i,
                p.numel, p.element_size);
    Open& o = open[p.key];
    o.plan.key = p.key;
    o.plan.params.push_back(static_cast<int>(i));
    o.plan.offsets.push_back(o.plan.numel);
    o.plan.numel += p.numel;
    o.bytes += p.numel * p.element_size;
    if (o.bytes >= (o.had_first ? options.cap_bytes : options.first_cap_bytes)) close(o);
  }
  for (auto& [key, o] : open) {
    if (!o.plan.params.empty()) close(o);
  }
  std::sort(done.begin(), done.end(),
            [](const BucketPlan& a, const BucketPlan& b) { return a.params.front() < b.params.front(); });
  return done;
}

comm::WorkPtr AllReduceReducer::start(Bucket& bucket) {
  return bucket.group->all_reduce(bucket.flat, {.op = bucket.op});
}

void AllReduceReducer::finish(Bucket& bucket) {
  if (bucket.post_scale != 1.0) bucket.flat.mul_(bucket.post_scale);
}

}  // namespace torus::dp
