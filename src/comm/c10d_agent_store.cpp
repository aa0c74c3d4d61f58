// The torch-facing half of the agent-store seam (src/comm/agent_store.h):
// torchrun's agent store reached through LibTorch's c10d::TCPStore client,
// behind Torus's Store interface, registered when libtorus is loaded.
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "comm/agent_store.h"
#include "core/log.h"

namespace torus::comm {
namespace {

class C10dAgentStore final : public Store {
 public:
  C10dAgentStore(const std::string& host, int port, Duration timeout) : where_(fmt::format("{}:{}", host, port)) {
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<std::uint16_t>(port);
    opts.isServer = false;
    opts.waitWorkers = false;
    opts.timeout = timeout;  // connecting, and get() without a timeout of its own
    store_ = call("connect", [&] { return c10::make_intrusive<c10d::TCPStore>(host, opts); });
  }

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    call("set " + key, [&] { store_->set(key, value); });
  }
  std::vector<uint8_t> get(const std::string& key, Duration timeout) override {
    return call("get " + key, [&] {
      store_->wait({key}, timeout);
      return store_->get(key);
    });
  }
  int64_t add(const std::string& key, int64_t delta) override {
    return call("add " + key, [&] { return store_->add(key, delta); });
  }
  void wait(const std::vector<std::string>& keys, Duration timeout) override {
    call("wait", [&] { store_->wait(keys, timeout); });
  }
  bool check(const std::vector<std::string>& keys) override {
    return call("check", [&] { return store_->check(keys); });
  }
  bool remove(const std::string& key) override {
    return call("remove " + key, [&] { return store_->deleteKey(key); });
  }

 private:
  // c10d's errors in Torus's model: a store timeout (DistStoreError) is a
  // TimeoutError, anything else from c10 a CommError; both name the agent's
  // store and the operation.
  template <typename F>
  auto call(const std::string& what, F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (const c10::DistStoreError& e) {
      throw TimeoutError(fmt::format("torchrun's agent store at {}: {}: {}", where_, what, e.what_without_backtrace()));
    } catch (const c10::Error& e) {
      throw CommError(fmt::format("torchrun's agent store at {}: {}: {}", where_, what, e.what_without_backtrace()));
    }
  }

  std::string where_;
  c10::intrusive_ptr<c10d::TCPStore> store_;
};

std::shared_ptr<Store> connect_c10d_agent_store(const std::string& host, int port, std::chrono::milliseconds timeout) {
  return std::make_shared<C10dAgentStore>(host, port, timeout);
}

// Registered when libtorus is loaded (Note [torchrun's agent store]).
[[maybe_unused]] const bool kRegistered = (register_agent_store_connector(&connect_c10d_agent_store), true);

}  // namespace
}  // namespace torus::comm
