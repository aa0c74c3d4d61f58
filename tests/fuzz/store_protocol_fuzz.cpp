// libFuzzer target for the store's wire decoders (src/comm/store_protocol.h):
// every byte string must either decode into a valid message or throw
// ProtocolError; nothing else (crash, other exception, sanitizer report) is
// allowed. A decoded request must also re-encode to the same bytes, so the
// decoder accepts exactly the canonical encoding.
//
// Built only with Clang (-fsanitize=fuzzer); see tests/fuzz/tests.cmake.
//   ./torus_store_protocol_fuzz -max_total_time=60 corpus/
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "comm/store_protocol.h"

namespace proto = torus::comm::store_proto;

namespace {

void check_request(std::span<const uint8_t> payload) {
  proto::Request req = proto::decode_request(payload);
  bool multi = req.type == proto::MsgType::kWait || req.type == proto::MsgType::kCheck;
  if (!multi && req.keys.size() != 1) std::abort();
  if (req.keys.size() > proto::kMaxKeysPerRequest || req.value.size() > torus::comm::kMaxValueBytes) std::abort();
  for (const auto& k : req.keys) {
    if (k.empty() || k.size() > torus::comm::kMaxKeyBytes) std::abort();
  }
  auto again = proto::encode_request(req);
  if (again.size() != payload.size() + proto::kFrameHeaderBytes ||
      std::memcmp(again.data() + proto::kFrameHeaderBytes, payload.data(), payload.size()) != 0) {
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::span<const uint8_t> payload(data + 1, size - 1);
  static constexpr proto::MsgType kRequestTypes[] = {proto::MsgType::kSet,  proto::MsgType::kGet,
                                                     proto::MsgType::kAdd,  proto::MsgType::kWait,
                                                     proto::MsgType::kCheck, proto::MsgType::kRemove};
  try {
    switch (data[0] % 5) {
      case 0:
        check_request(payload);
        break;
      case 1:
        (void)proto::decode_reply(kRequestTypes[(data[0] / 5) % 6], payload);
        break;
      case 2:
        (void)proto::decode_server_hello(payload);
        break;
      case 3: {
        proto::Nonce n{};
        proto::Mac m{};
        proto::decode_client_auth(payload, &n, &m);
        break;
      }
      case 4: {
        proto::Mac m{};
        (void)proto::decode_server_auth(payload, &m);
        break;
      }
    }
  } catch (const proto::ProtocolError&) {
  }
  return 0;
}
