// The store's wire protocol on its own, without sockets: round trips of every
// request and reply, rejection of truncated/oversized/trailing input, a seeded
// decoder fuzz (random and mutated payloads either decode into a valid,
// canonically re-encodable request or throw ProtocolError), and the HMAC
// handshake values checked against an independent OpenSSL computation.
#include <gtest/gtest.h>
#include <openssl/evp.h>

#include <random>

#include "store_test_util.h"

namespace torus::comm::test {
namespace {

std::span<const uint8_t> payload_of(const std::vector<uint8_t>& frame) {
  EXPECT_GE(frame.size(), proto::kFrameHeaderBytes);
  EXPECT_EQ(proto::read_frame_length(frame.data()), frame.size() - proto::kFrameHeaderBytes);
  return std::span<const uint8_t>(frame).subspan(proto::kFrameHeaderBytes);
}

std::vector<proto::Request> sample_requests() {
  std::vector<proto::Request> out;
  proto::Request r;
  r.type = proto::MsgType::kSet;
  r.keys = {"a/key"};
  r.value = {0, 1, 2, 255};
  out.push_back(r);
  r = {};
  r.type = proto::MsgType::kGet;
  r.keys = {std::string(kMaxKeyBytes, 'g')};
  r.timeout_ms = 123456789012ull;
  out.push_back(r);
  r = {};
  r.type = proto::MsgType::kAdd;
  r.keys = {"n"};
  r.delta = -42;
  out.push_back(r);
  r = {};
  r.type = proto::MsgType::kWait;
  r.keys = {"x", "y", std::string("\0z", 2)};
  r.timeout_ms = 7;
  out.push_back(r);
  r = {};
  r.type = proto::MsgType::kCheck;
  r.keys = {};
  out.push_back(r);
  r = {};
  r.type = proto::MsgType::kRemove;
  r.keys = {"gone"};
  out.push_back(r);
  return out;
}

void expect_same(const proto::Request& a, const proto::Request& b) {
  EXPECT_EQ(a.type, b.type);
  EXPECT_EQ(a.keys, b.keys);
  EXPECT_EQ(a.value, b.value);
  EXPECT_EQ(a.delta, b.delta);
  EXPECT_EQ(a.timeout_ms, b.timeout_ms);
}

TEST(StoreProtocol, RequestsRoundTrip) {
  for (const auto& req : sample_requests()) {
    auto frame = proto::encode_request(req);
    expect_same(proto::decode_request(payload_of(frame)), req);
  }
}

TEST(StoreProtocol, FieldLayoutIsLittleEndian) {
  proto::Request r;
  r.type = proto::MsgType::kAdd;
  r.keys = {"k"};
  r.delta = 0x0102030405060708;
  auto f = proto::encode_request(r);
  // len=1+4+1+8=14 | type | klen=1 | 'k' | delta
  std::vector<uint8_t> expected = {14, 0, 0, 0, 18, 1, 0, 0, 0, 'k', 8, 7, 6, 5, 4, 3, 2, 1};
  EXPECT_EQ(f, expected);
}

TEST(StoreProtocol, TruncationsAndTrailingBytesAreRejected) {
  for (const auto& req : sample_requests()) {
    auto frame = proto::encode_request(req);
    auto payload = payload_of(frame);
    for (size_t n = 0; n < payload.size(); ++n) {
      EXPECT_THROW(proto::decode_request(payload.first(n)), proto::ProtocolError)
          << proto::msg_type_name(req.type) << " truncated to " << n;
    }
    std::vector<uint8_t> longer(payload.begin(), payload.end());
    longer.push_back(0);
    EXPECT_THROW(proto::decode_request(longer), proto::ProtocolError);
  }
}

TEST(StoreProtocol, BoundsAreChecked) {
  using proto::FrameWriter;
  using proto::MsgType;
  auto decode = [](std::vector<uint8_t> frame) { return proto::decode_request(payload_of(frame)); };
  std::string max_key(kMaxKeyBytes, 'k');
  EXPECT_NO_THROW(decode(std::move(FrameWriter(MsgType::kRemove).bytes(max_key)).finish()));
  EXPECT_THROW(decode(std::move(FrameWriter(MsgType::kRemove).bytes(max_key + "k")).finish()), proto::ProtocolError);
  EXPECT_THROW(decode(std::move(FrameWriter(MsgType::kRemove).bytes("")).finish()), proto::ProtocolError);
  EXPECT_THROW(decode(std::move(FrameWriter(MsgType::kSet).bytes("k").u32(kMaxValueBytes + 1)).finish()),
               proto::ProtocolError);
  std::vector<std::string> many(proto::kMaxKeysPerRequest, "k");
  EXPECT_EQ(decode(std::move(FrameWriter(MsgType::kCheck).keys(many)).finish()).keys.size(), many.size());
  EXPECT_THROW(decode(std::move(FrameWriter(MsgType::kCheck).u32(proto::kMaxKeysPerRequest + 1)).finish()),
               proto::ProtocolError);
  // A count the frame cannot hold is rejected before anything is reserved.
  EXPECT_THROW(decode(std::move(FrameWriter(MsgType::kCheck).u32(4000)).finish()), proto::ProtocolError);
  EXPECT_THROW(decode(std::move(FrameWriter(static_cast<MsgType>(0)).u8(0)).finish()), proto::ProtocolError);
  EXPECT_THROW(decode(std::move(FrameWriter(MsgType::kReply).u8(0)).finish()), proto::ProtocolError);
  EXPECT_THROW(proto::decode_request({}), proto::ProtocolError);
}

TEST(StoreProtocol, RepliesRoundTripAndAreValidated) {
  proto::Reply r;
  r.value = {9, 8, 7};
  auto got = proto::decode_reply(proto::MsgType::kGet, payload_of(proto::encode_reply(proto::MsgType::kGet, r)));
  EXPECT_EQ(got.value, r.value);
  r = {};
  r.integer = -5;
  EXPECT_EQ(proto::decode_reply(proto::MsgType::kAdd, payload_of(proto::encode_reply(proto::MsgType::kAdd, r))).integer,
            -5);
  r = {};
  r.flag = true;
  EXPECT_TRUE(
      proto::decode_reply(proto::MsgType::kCheck, payload_of(proto::encode_reply(proto::MsgType::kCheck, r))).flag);
  r = {};
  r.status = proto::Status::kTimeout;
  r.missing_keys = {"m1", "m2"};
  EXPECT_EQ(
      proto::decode_reply(proto::MsgType::kWait, payload_of(proto::encode_reply(proto::MsgType::kWait, r))).missing_keys,
      r.missing_keys);
  r = {};
  r.status = proto::Status::kInvalidArgument;
  r.message = "nope";
  EXPECT_EQ(
      proto::decode_reply(proto::MsgType::kAdd, payload_of(proto::encode_reply(proto::MsgType::kAdd, r))).message,
      "nope");

  std::vector<uint8_t> bad_bool = {static_cast<uint8_t>(proto::MsgType::kReply), 0, 2};
  EXPECT_THROW(proto::decode_reply(proto::MsgType::kCheck, bad_bool), proto::ProtocolError);
  std::vector<uint8_t> bad_status = {static_cast<uint8_t>(proto::MsgType::kReply), 9};
  EXPECT_THROW(proto::decode_reply(proto::MsgType::kSet, bad_status), proto::ProtocolError);
  std::vector<uint8_t> not_reply = {static_cast<uint8_t>(proto::MsgType::kSet), 0};
  EXPECT_THROW(proto::decode_reply(proto::MsgType::kSet, not_reply), proto::ProtocolError);
  std::vector<uint8_t> timeout_to_set = {static_cast<uint8_t>(proto::MsgType::kReply), 1, 0, 0, 0, 0};
  EXPECT_THROW(proto::decode_reply(proto::MsgType::kSet, timeout_to_set), proto::ProtocolError);
}

bool request_is_valid(const proto::Request& r) {
  if (r.value.size() > kMaxValueBytes || r.keys.size() > proto::kMaxKeysPerRequest) return false;
  for (const auto& k : r.keys) {
    if (k.empty() || k.size() > kMaxKeyBytes) return false;
  }
  bool multi = r.type == proto::MsgType::kWait || r.type == proto::MsgType::kCheck;
  return multi || r.keys.size() == 1;
}

TEST(StoreProtocol, DecoderFuzzNeverMisbehaves) {
  std::mt19937_64 rng(12345);
  std::vector<std::vector<uint8_t>> seeds;
  for (const auto& req : sample_requests()) {
    auto f = proto::encode_request(req);
    seeds.emplace_back(f.begin() + proto::kFrameHeaderBytes, f.end());
  }
  int decoded = 0, rejected = 0;
  for (int iter = 0; iter < 100000; ++iter) {
    std::vector<uint8_t> input;
    if (iter % 4 == 0) {
      input.resize(rng() % 64);
      for (auto& b : input) b = static_cast<uint8_t>(rng());
      if (!input.empty()) input[0] = static_cast<uint8_t>(16 + rng() % 7);  // mostly known types
    } else {
      input = seeds[rng() % seeds.size()];
      if (input.size() > 1000) input.resize(40);  // keep the big-key seed cheap
      int flips = 1 + static_cast<int>(rng() % 4);
      for (int j = 0; j < flips && !input.empty(); ++j) input[rng() % input.size()] ^= static_cast<uint8_t>(rng());
      if (rng() % 5 == 0) input.resize(rng() % (input.size() + 1));
    }
    try {
      proto::Request req = proto::decode_request(input);
      ASSERT_TRUE(request_is_valid(req)) << "iteration " << iter;
      // The encoding is canonical: what decodes re-encodes to the same bytes.
      auto again = proto::encode_request(req);
      ASSERT_EQ(std::vector<uint8_t>(again.begin() + proto::kFrameHeaderBytes, again.end()), input)
          << "iteration " << iter;
      ++decoded;
    } catch (const proto::ProtocolError&) {
      ++rejected;
    }
  }
  EXPECT_GT(decoded, 100);   // the fuzz reaches the accepting paths
  EXPECT_GT(rejected, 1000);  // and the rejecting ones
}

// HMAC-SHA-256 through OpenSSL's EVP_MAC interface, independent of auth_mac.
proto::Mac reference_hmac(const std::string& key, const std::string& msg) {
  proto::Mac out{};
  size_t len = 0;
  EVP_Q_mac(nullptr, "HMAC", nullptr, "SHA256", nullptr, key.data(), key.size(),
            reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out.data(), out.size(), &len);
  EXPECT_EQ(len, out.size());
  return out;
}

TEST(StoreProtocol, HandshakeMacsMatchTheSpecifiedConstruction) {
  proto::Nonce sn{}, cn{};
  for (size_t i = 0; i < sn.size(); ++i) {
    sn[i] = static_cast<uint8_t>(i);
    cn[i] = static_cast<uint8_t>(200 - i);
  }
  std::string nonces(reinterpret_cast<const char*>(sn.data()), sn.size());
  nonces.append(reinterpret_cast<const char*>(cn.data()), cn.size());
  auto client = proto::auth_mac("tok", proto::Direction::kClient, sn, cn);
  auto server = proto::auth_mac("tok", proto::Direction::kServer, sn, cn);
  EXPECT_EQ(client, reference_hmac("tok", "torus-store-v1|client|" + nonces));
  EXPECT_EQ(server, reference_hmac("tok", "torus-store-v1|server|" + nonces));
  EXPECT_FALSE(proto::mac_equal(client, server));  // no reflection
  EXPECT_FALSE(proto::mac_equal(client, proto::auth_mac("tok2", proto::Direction::kClient, sn, cn)));
  EXPECT_TRUE(proto::mac_equal(client, proto::auth_mac("tok", proto::Direction::kClient, sn, cn)));
  EXPECT_NE(proto::random_nonce(), proto::random_nonce());

  // Handshake messages round trip; a bad magic is refused.
  EXPECT_EQ(proto::decode_server_hello(payload_of(proto::encode_server_hello(sn))), sn);
  proto::Nonce n2{};
  proto::Mac m2{};
  proto::decode_client_auth(payload_of(proto::encode_client_auth(cn, client)), &n2, &m2);
  EXPECT_EQ(n2, cn);
  EXPECT_EQ(m2, client);
  EXPECT_TRUE(proto::decode_server_auth(payload_of(proto::encode_server_auth(server)), &m2));
  EXPECT_EQ(m2, server);
  EXPECT_FALSE(proto::decode_server_auth(payload_of(proto::encode_auth_rejected()), &m2));
  auto hello = proto::encode_server_hello(sn);
  hello[proto::kFrameHeaderBytes + 1] ^= 1;
  EXPECT_THROW(proto::decode_server_hello(payload_of(hello)), proto::ProtocolError);
}

TEST(StoreProtocol, PrintableKeysAreEscapedAndTruncated) {
  EXPECT_EQ(proto::printable_key("a/b"), "'a/b'");
  EXPECT_EQ(proto::printable_key(std::string("\x01'", 2)), "'\\x01\\x27'");
  std::string long_key(1000, 'x');
  auto p = proto::printable_key(long_key);
  EXPECT_LT(p.size(), 200u);
  EXPECT_NE(p.find("1000 bytes"), std::string::npos);
}

}  // namespace
}  // namespace torus::comm::test
