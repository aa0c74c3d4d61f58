// The torch-free half of the agent-store seam (agent_store.h).
#include "comm/agent_store.h"

#include <atomic>
#include <charconv>
#include <vector>

#include "core/log.h"

namespace torus::comm {
namespace {

// Constant-initialised, so registration at load time needs no order among
// static initialisers.
std::atomic<AgentStoreConnector> g_connector{nullptr};

constexpr std::string_view kRecordTag = "torus-store-v1";
constexpr size_t kMaxRecordBytes = 4096;

bool plain_field(std::string_view s, size_t max_bytes) {
  if (s.empty() || s.size() > max_bytes) return false;
  for (char c : s) {
    if (c <= ' ' || c > '~') return false;
  }
  return true;
}

}  // namespace

void register_agent_store_connector(AgentStoreConnector connect) {
  g_connector.store(connect);
}

std::shared_ptr<Store> connect_agent_store(const std::string& host, int port, std::chrono::milliseconds timeout) {
  AgentStoreConnector connect = g_connector.load();
  TORUS_CHECK(connect != nullptr, Unsupported,
              "torchrun's agent serves the store at {}:{} (TORCHELASTIC_USE_AGENT_STORE), and its client comes with "
              "the torch-facing library (libtorus), which this program does not load",
              host, port);
  return connect(host, port, timeout);
}

std::string agent_store_key(const AgentStoreInfo& info) {
  return fmt::format("torus/{}/attempt_{}/store", info.run_id, info.restart_count);
}

std::string encode_agent_store_record(const AgentStoreRecord& r) {
  TORUS_CHECK(
      plain_field(r.host, 255) && r.port > 0 && r.port <= 65535 && (r.token.empty() || plain_field(r.token, 1024)),
      InvalidArgument, "cannot publish the store address {}:{} (a token with spaces?)", r.host, r.port);
  std::string text = fmt::format("{} {} {}", kRecordTag, r.host, r.port);
  if (!r.token.empty()) text += " " + r.token;
  return text;
}

AgentStoreRecord decode_agent_store_record(std::string_view text) {
  auto bad = [&](const char* why) {
    // The text is not quoted: it may hold a token.
    return CommError(fmt::format("malformed store address in torchrun's agent store ({}; {} bytes)", why, text.size()));
  };
  if (text.size() > kMaxRecordBytes) throw bad("too long");
  std::vector<std::string_view> fields;
  size_t pos = 0;
  while (pos <= text.size() && fields.size() < 5) {
    size_t sp = text.find(' ', pos);
    fields.push_back(text.substr(pos, sp == std::string_view::npos ? std::string_view::npos : sp - pos));
    if (sp == std::string_view::npos) break;
    pos = sp + 1;
  }
  if (fields.size() < 3 || fields.size() > 4 || fields[0] != kRecordTag) throw bad("not 'torus-store-v1 host port'");
  AgentStoreRecord r;
  if (!plain_field(fields[1], 255)) throw bad("host");
  r.host = std::string(fields[1]);
  auto [end, ec] = std::from_chars(fields[2].data(), fields[2].data() + fields[2].size(), r.port);
  if (ec != std::errc() || end != fields[2].data() + fields[2].size() || r.port <= 0 || r.port > 65535) {
    throw bad("port");
  }
  if (fields.size() == 4) {
    if (!plain_field(fields[3], 1024)) throw bad("token");
    r.token = std::string(fields[3]);
  }
  return r;
}

}  // namespace torus::comm
