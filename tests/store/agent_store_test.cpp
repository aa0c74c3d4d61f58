// The torch-free half of the agent-store seam (src/comm/agent_store.h): the
// key of a restart attempt, the record rank 0 publishes (read back bounded
// and validated, since the agent's store is open), and the error of a
// program without the torch-facing connector.
#include "comm/agent_store.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "torus/core/error.h"

namespace torus::comm {
namespace {

TEST(AgentStore, KeyNamesTheRunAndTheAttempt) {
  EXPECT_EQ(agent_store_key({"job7", 0}), "torus/job7/attempt_0/store");
  EXPECT_EQ(agent_store_key({"job7", 2}), "torus/job7/attempt_2/store");
  EXPECT_NE(agent_store_key({"job7", 1}), agent_store_key({"job8", 1}));
}

TEST(AgentStore, RecordRoundTrip) {
  AgentStoreRecord with_token{"10.1.2.3", 41234, "0123abcd"};
  EXPECT_EQ(encode_agent_store_record(with_token), "torus-store-v1 10.1.2.3 41234 0123abcd");
  AgentStoreRecord r = decode_agent_store_record(encode_agent_store_record(with_token));
  EXPECT_EQ(r.host, "10.1.2.3");
  EXPECT_EQ(r.port, 41234);
  EXPECT_EQ(r.token, "0123abcd");

  AgentStoreRecord no_token{"::1", 5, ""};
  EXPECT_EQ(encode_agent_store_record(no_token), "torus-store-v1 ::1 5");
  r = decode_agent_store_record("torus-store-v1 ::1 5");
  EXPECT_EQ(r.host, "::1");
  EXPECT_EQ(r.port, 5);
  EXPECT_TRUE(r.token.empty());

  EXPECT_THROW(encode_agent_store_record({"h", 0, ""}), InvalidArgument);
  EXPECT_THROW(encode_agent_store_record({"h", 1, "a token"}), InvalidArgument);
  EXPECT_THROW(encode_agent_store_record({"", 1, ""}), InvalidArgument);
}

TEST(AgentStore, MalformedRecordsAreRefusedWithoutQuotingThem) {
  const std::string secret = "s3cr3t";
  for (const std::string& bad :
       std::vector<std::string>{"", "torus-store-v1", "torus-store-v1 h", "torus-store-v2 h 1", "torus-store-v1 h 0",
                                "torus-store-v1 h 65536", "torus-store-v1 h 12x", "torus-store-v1 h -1",
                                "torus-store-v1  1", "torus-store-v1 h 1 ", "torus-store-v1 h 1 s3cr3t extra",
                                "torus-store-v1 h\t 1", "torus-store-v1 h 1 s3cr3t\n", std::string(5000, 'x')}) {
    try {
      decode_agent_store_record(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("torchrun's agent store"), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find(secret), std::string::npos) << "the error quotes the record: " << e.what();
    }
  }
}

// This test links only the torch-free objects: no connector is registered.
TEST(AgentStore, WithoutTheTorchFacingLibraryTheErrorSaysWhy) {
  try {
    connect_agent_store("127.0.0.1", 29500, std::chrono::milliseconds(100));
    ADD_FAILURE() << "connected without a connector";
  } catch (const Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find("TORCHELASTIC_USE_AGENT_STORE"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace torus::comm
