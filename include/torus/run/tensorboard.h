// torus/run/tensorboard.h — scalars in TensorBoard event files.
// LibTorch-free.
//
//   TensorBoardWriter tb("runs/x/tb");     // creates the directory
//   tb.add_scalar("train/loss", 2.31, 40);
//   tb.flush();
//
// The file is `<dir>/events.out.tfevents.<unix time>.<host>`: TFRecord
// framing (little-endian u64 length, masked CRC-32C of the length, the
// bytes, masked CRC-32C of the bytes) around serialised `tensorflow.Event`
// protocol buffers — the first with file_version "brain.Event:2", then one
// Event per scalar holding wall_time, step and a Summary with one
// simple_value. The few protobuf fields involved are encoded here (varints,
// fixed64/fixed32, length-delimited); nothing is read back or executed.
//
// Every record is written with one fwrite; flush() pushes them to the file
// (the training loop flushes after each step). Not thread safe.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace torus::run {

class TensorBoardWriter {
 public:
  // Creates `dir` (and parents) and a new event file in it. Throws
  // torus::Error naming the path if either fails.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One scalar at `step`, stamped with the current wall time. Non-finite
  // values are written as they are (TensorBoard shows NaN/inf). Throws
  // torus::Error if the write fails.
  void add_scalar(std::string_view tag, double value, int64_t step);
  void flush();

  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& bytes);
  std::string path_;
  std::FILE* file_ = nullptr;
};

// CRC-32C (Castagnoli) of `data`, and TFRecord's masked form of it; exposed
// for tests.
uint32_t crc32c(std::string_view data);
uint32_t masked_crc32c(std::string_view data);

}  // namespace torus::run
