// StageProgram over the Neuron runtime (src/device/neuron/neff_program.cpp)
// with the fake runtime's declarative test programs (fake_nrt.cpp): load,
// describe, bind (whole allocations and parts of them), execute, time, and
// every refusal before the runtime is called.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "torus/core/error.h"
#include "torus/device/device.h"
#include "torus/device/stage_program.h"

namespace torus::device {
namespace {

std::span<const std::byte> as_bytes(const std::string& s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

const size_t kN = 1000;
const std::string kAxpy =
    "torus-fake-neff 1\n"
    "input x 4000\n"
    "input y 4000\n"
    "output t 4000\n"
    "output z 4000\n"
    "op scale t x 2.5\n"
    "op add z t y\n";

Device& neuron() { return get_device(DeviceType::kNeuron); }

TEST(NeffProgram, DescribesBindsAndExecutes) {
  auto p = neuron::load_neff(as_bytes(kAxpy), 1);
  ASSERT_EQ(p->tensors().size(), 4u);
  EXPECT_EQ(p->tensors()[0].name, "x");
  EXPECT_TRUE(p->tensors()[1].input);
  EXPECT_EQ(p->tensors()[2].name, "t");
  EXPECT_FALSE(p->tensors()[3].input);
  EXPECT_EQ(p->tensors()[3].bytes, kN * sizeof(float));
  std::vector<float> x(kN), y(kN);
  for (size_t i = 0; i < kN; ++i) {
    x[i] = static_cast<float>(i);
    y[i] = 1.0f - static_cast<float>(i);
  }
  // x and y in one allocation (parts: slices); t and z in their own.
  DeviceBuffer xy(DeviceType::kNeuron, 2 * kN * sizeof(float));
  DeviceBuffer t(DeviceType::kNeuron, kN * sizeof(float)), z(DeviceType::kNeuron, kN * sizeof(float));
  neuron().copy(xy.data(), x.data(), kN * sizeof(float));
  neuron().copy(xy.as<float>() + kN, y.data(), kN * sizeof(float));
  p->bind("x", xy.data(), kN * sizeof(float));
  p->bind("y", xy.as<float>() + kN, kN * sizeof(float));
  p->bind("t", t.data(), kN * sizeof(float));
  p->bind("z", z.data(), kN * sizeof(float));
  p->execute();
  p->execute();
  std::vector<float> got(kN);
  neuron().copy(got.data(), z.data(), kN * sizeof(float));
  for (size_t i = 0; i < kN; ++i) ASSERT_EQ(got[i], x[i] * 2.5f + y[i]) << i;
  EXPECT_EQ(p->stats().executions, 2u);
  EXPECT_GE(p->stats().total_ms, p->stats().max_ms);
  EXPECT_LE(p->stats().min_ms, p->stats().max_ms);
}

TEST(NeffProgram, TimesExecution) {
  auto p = neuron::load_neff(as_bytes("torus-fake-neff 1\ninput a 8\noutput b 8\nop copy b a\nsleep_ms 30\n"), 0);
  DeviceBuffer a(DeviceType::kNeuron, 8), b(DeviceType::kNeuron, 8);
  p->bind("a", a.data(), 8);
  p->bind("b", b.data(), 8);
  p->execute();
  EXPECT_GE(p->stats().last_ms, 30.0);
  EXPECT_LT(p->stats().last_ms, 3000.0);
}

TEST(NeffProgram, RefusesBadBindingsBeforeTheRuntime) {
  auto p = neuron::load_neff(as_bytes(kAxpy), 0);
  DeviceBuffer a(DeviceType::kNeuron, kN * sizeof(float));
  std::vector<float> host(kN);
  try {
    p->bind("w", a.data(), kN * sizeof(float));
    ADD_FAILURE() << "an unknown tensor name was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("has no tensor 'w' (it has: x, y, t, z)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(p->bind("x", a.data(), 16), InvalidArgument);
  EXPECT_THROW(p->bind("x", host.data(), kN * sizeof(float)), InvalidArgument);
  p->bind("x", a.data(), kN * sizeof(float));
  try {
    p->execute();
    ADD_FAILURE() << "executing with unbound tensors was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("unbound tensors: y, t, z"), std::string::npos) << e.what();
  }
  EXPECT_EQ(p->stats().executions, 0u);
}

TEST(NeffProgram, RefusesWhatIsNotAProgram) {
  try {
    neuron::load_neff(as_bytes("#!/bin/sh\nrm -rf /\n"), 0);
    ADD_FAILURE() << "a shell script was loaded as a program";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("refused the program (nrt_load: NRT_INVALID"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(neuron::load_neff(std::string("/nonexistent/stage.neff"), 0), Error);
  EXPECT_THROW(neuron::load_neff(as_bytes(kAxpy), 9), InvalidArgument);
  // From a file.
  std::string path = testing::TempDir() + "/stage.neff";
  std::ofstream(path) << kAxpy;
  auto p = neuron::load_neff(path, 0);
  EXPECT_EQ(p->source(), path);
  EXPECT_EQ(p->tensors().size(), 4u);
}

// Run in the configurations without a usable runtime (tests.cmake).
TEST(NeffProgramWithoutRuntime, NeedsTheRuntime) {
  EXPECT_THROW(neuron::load_neff(as_bytes(kAxpy), 0), Error);
}

}  // namespace
}  // namespace torus::device
