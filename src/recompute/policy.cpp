// Recompute policies: parsing, names, which blocks (recompute.h).
#include <charconv>

#include "core/log.h"
#include "torus/recompute/recompute.h"

namespace torus::recompute {
namespace {

constexpr std::string_view kForms = "'none', 'full', 'every:K' (K >= 1) or 'selective'";

}  // namespace

Policy Policy::every(int64_t k) {
  TORUS_CHECK(k >= 1, InvalidArgument, "recompute policy every:K needs K >= 1, got {}", k);
  return {Kind::kEvery, k};
}

Policy Policy::parse(std::string_view text) {
  if (text == "none") return none();
  if (text == "full") return full();
  if (text == "selective") return selective();
  constexpr std::string_view kEveryPrefix = "every:";
  if (text.substr(0, kEveryPrefix.size()) == kEveryPrefix) {
    const std::string_view digits = text.substr(kEveryPrefix.size());
    int64_t k = 0;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), k);
    TORUS_CHECK(!digits.empty() && ec == std::errc() && end == digits.data() + digits.size() && k >= 1,
                InvalidArgument, "recompute policy '{}': K must be a decimal integer >= 1 (accepted: {})", text,
                kForms);
    return every(k);
  }
  throw InvalidArgument(fmt::format("unknown recompute policy '{}' (accepted: {})", text, kForms));
}

std::string Policy::name() const {
  switch (kind) {
    case Kind::kNone:
      return "none";
    case Kind::kFull:
      return "full";
    case Kind::kEvery:
      return "every:" + std::to_string(every_k);
    case Kind::kSelective:
      return "selective";
  }
  return "?";
}

void Policy::validate() const {
  TORUS_CHECK(kind == Kind::kNone || kind == Kind::kFull || kind == Kind::kEvery || kind == Kind::kSelective,
              InvalidArgument, "recompute policy: unknown kind {}", static_cast<int>(kind));
  TORUS_CHECK(kind != Kind::kEvery || every_k >= 1, InvalidArgument,
              "recompute policy every:K needs K >= 1, got {}", every_k);
  TORUS_CHECK(kind == Kind::kEvery || every_k == 0, InvalidArgument,
              "recompute policy '{}' takes no K (every_k = {}); only every:K does", name(), every_k);
}

bool Policy::recompute_block(int64_t global_layer) const {
  switch (kind) {
    case Kind::kFull:
      return true;
    case Kind::kEvery:
      return global_layer % every_k == 0;
    case Kind::kNone:
    case Kind::kSelective:
      return false;
  }
  return false;
}

}  // namespace torus::recompute
