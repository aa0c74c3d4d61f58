// The registry of comm backends and the choices made from it (Note [Backend
// registration] in backend_registry.h).
#include "comm/backend_registry.h"

#include <algorithm>

#include "core/log.h"

namespace torus::comm {

void BackendRegistry::add(BackendFactory factory) {
  TORUS_CHECK(!factory.name.empty() && factory.create, InvalidArgument,
              "a comm backend registers without a name or a factory");
  TORUS_CHECK(find(factory.name) == nullptr, InvalidArgument, "comm backend '{}' is registered twice", factory.name);
  factories_.push_back(std::move(factory));
}

void BackendRegistry::add_channel(std::string launcher, LauncherChannel channel) {
  TORUS_CHECK(channel.hold && channel.broadcast, InvalidArgument, "launcher channel '{}' is incomplete", launcher);
  TORUS_CHECK(this->channel(launcher) == nullptr, InvalidArgument, "launcher channel '{}' is registered twice",
              launcher);
  channels_.emplace_back(std::move(launcher), std::move(channel));
}

const BackendFactory* BackendRegistry::find(std::string_view name) const {
  for (const auto& f : factories_) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

const LauncherChannel* BackendRegistry::channel(std::string_view launcher) const {
  for (const auto& [name, c] : channels_) {
    if (name == launcher) return &c;
  }
  return nullptr;
}

const BackendRegistry& backend_registry() {
  static const BackendRegistry r = [] {
    BackendRegistry built;
    register_built_backends(built);
    return built;
  }();
  return r;
}

const LauncherChannel* launcher_channel(std::string_view launcher) { return backend_registry().channel(launcher); }

bool backend_registered(std::string_view name) noexcept {
  try {
    return backend_registry().find(name) != nullptr;
  } catch (...) {
    return false;  // a registration that throws is a bug; "not there" is the safe answer
  }
}

std::vector<std::string> registered_backends() {
  std::vector<std::string> names;
  for (const auto& f : backend_registry().factories()) names.push_back(f.name);
  return names;
}

std::vector<std::string> Context::available_host_backends() {
  std::vector<std::string> names;
  for (const auto& f : backend_registry().factories()) {
    if (f.role == BackendRole::kHost) names.push_back(f.name);
  }
  return names;
}

BackendPtr create_world_backend(const std::string& name, const BackendInit& init) {
  const BackendFactory* f = backend_registry().find(name);
  if (f == nullptr) {
    throw Unsupported(fmt::format("comm backend '{}' is not built into this Torus (built: {})", name,
                                  fmt::join(registered_backends(), ", ")));
  }
  return f->create(init);
}

HostBackendChoice choose_host_backend(const BackendInit& init) {
  std::vector<const BackendFactory*> hosts;
  for (const auto& f : backend_registry().factories()) {
    if (f.role == BackendRole::kHost) hosts.push_back(&f);
  }
  TORUS_CHECK(!hosts.empty(), Unsupported, "this Torus was built without a host backend (mpi or ofi)");
  std::stable_sort(hosts.begin(), hosts.end(),
                   [](const BackendFactory* a, const BackendFactory* b) { return a->preference > b->preference; });
  std::vector<std::string> passed;  // "ofi: <why not>" for each better one that cannot serve
  for (const BackendFactory* f : hosts) {
    const Usability u = f->usability ? f->usability(init) : Usability{};
    if (!u.usable) {
      passed.push_back(fmt::format("{} unusable: {}", f->name, u.detail));
      continue;
    }
    std::string why = "default";
    if (!u.detail.empty()) why += ", " + u.detail;
    if (passed.empty() && hosts.size() > 1) {
      std::vector<std::string> others;
      for (const BackendFactory* o : hosts) {
        if (o != f) others.push_back(o->name);
      }
      why += fmt::format(", preferred to {}", fmt::join(others, ", "));
    }
    for (const auto& p : passed) why += "; " + p;
    return {f->name, why + "; TORUS_BACKEND overrides"};
  }
  throw Unsupported(fmt::format("no host backend of this Torus can serve this job: {}", fmt::join(passed, "; ")));
}

HostBackendChoice agree_host_backend(const BackendInit& init, Duration timeout) {
  TORUS_CHECK(init.launch != nullptr && init.store != nullptr, InvalidArgument,
              "agree_host_backend needs the launch info and the store");
  constexpr const char* kKey = "torus/host_backend";
  if (init.launch->rank == 0) {
    try {
      HostBackendChoice c = choose_host_backend(init);
      init.store->set_string(kKey, c.name + "\n" + c.why);
      return c;
    } catch (const Error& e) {
      init.store->set_string(kKey, std::string("\n") + e.what());  // an empty name: the others fail alike
      throw;
    }
  }
  const std::string v = init.store->get_string(kKey, timeout);
  const size_t nl = v.find('\n');
  TORUS_CHECK(nl != std::string::npos, CommError, "malformed host backend choice from rank 0");
  TORUS_CHECK(nl > 0, Unsupported, "rank 0 could not choose a host backend: {}", v.substr(1));
  return {v.substr(0, nl), v.substr(nl + 1)};
}

}  // namespace torus::comm
