// The sharded checkpoint layer (checkpoint.h), single process: ranks are
// emulated by calling write_rank once per rank, then finalize. Expected
// values are slices of the global tensor cut independently with narrow().
//  * resharding: pieces of a tp4 x dp2 ZeRO layout (flat ranges of a padded
//    TP shard) load into tp3 boxes and tp3 ZeRO ranges, padding zero-filled;
//  * a piece missing: refused, naming the tensor;
//  * corruption: a flipped byte, a truncated file, a missing file, a manifest
//    of another checkpoint, no COMPLETE marker — each refused naming the file;
//  * a disk that fills during a save (injected ENOSPC): the error names the
//    file and errno, the previous checkpoint stays the newest complete one;
//  * export to one safetensors file of full, unpadded tensors;
//  * a checkpoint written from host buffers (buffers.h) read as any other.
#include <ATen/Functions.h>
#include <gtest/gtest.h>

#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "checkpoint/file_io.h"
#include "torus/checkpoint/checkpoint.h"

namespace torus::ckpt {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kRows = 10, kCols = 6;  // the global tensor W; padded to 12 rows for tp 3 and 4

at::Tensor global_w() {
  at::Generator g = at::detail::createCPUGenerator(42);
  return at::randn({kRows, kCols}, g, at::TensorOptions().dtype(at::kFloat));
}
at::Tensor padded_w(int64_t rows) {
  at::Tensor p = at::zeros({rows, kCols});
  p.narrow(0, 0, kRows).copy_(global_w());
  return p;
}
at::Tensor global_b() { return at::arange(5, at::TensorOptions().dtype(at::kFloat)).mul(0.5); }

std::string fresh_dir(const std::string& name) {
  const fs::path p = fs::path(::testing::TempDir()) / ("torus_ckpt_unit_" + std::to_string(::getpid())) / name;
  remove_tree(p);
  fs::create_directories(p);
  return p.string();
}

RunInfo info_for(int64_t step, int world, const std::string& run_id = "run0") {
  RunInfo i;
  i.run_id = run_id;
  i.step = step;
  i.world_size = world;
  i.layout = R"({"tp":4,"dp":2})";
  return i;
}

// Rank r = tp * 2 + dp of a tp4 x dp2 ZeRO layout: the flat half `dp` of TP
// shard `tp` (3 rows of the 12-row padded W).
ShardedState source_rank(int r) {
  const int tp = r / 2, dp = r % 2;
  const at::Tensor shard = padded_w(12).narrow(0, 3 * tp, 3).reshape({-1});
  ShardedState s;
  TensorSlice w;
  w.tensor = shard.slice(0, 9 * dp, 9 * dp + 9).clone();
  w.global_shape = {kRows, kCols};
  w.box_offset = {3 * tp, 0};
  w.box_shape = {3, kCols};
  w.flat_begin = 9 * dp;
  w.flat_end = 9 * dp + 9;
  s["model.w"] = w;
  if (r == 0) {
    s["model.b"] = {global_b(), {5}};
    s["engine.step"] = {at::full({}, 7, at::TensorOptions().dtype(at::kLong)), {}};
  }
  TensorSlice rng;
  rng.tensor = at::full({4}, r, at::TensorOptions().dtype(at::kByte));
  rng.global_shape = {4};
  rng.per_rank = true;
  s["rng.stage0.sharded"] = rng;
  return s;
}

std::string save_source(const std::string& dir, int64_t step, const std::string& run_id = "run0") {
  const RunInfo info = info_for(step, 8, run_id);
  RankWrite first;
  for (int r = 7; r >= 0; --r) {  // rank 0 last: its finalize finds every other rank done
    RankWrite w = write_rank(dir, r, source_rank(r), info);
    if (r == 0) first = w;
  }
  return finalize(first, info);
}

TEST(Slices, ReshardPaddedTpZeroIntoOtherTpAndZero) {
  const std::string dir = fresh_dir("reshard");
  const std::string path = save_source(dir, 3);
  EXPECT_EQ(path, (fs::path(dir) / "step-00000003").string());
  const Checkpoint ck = Checkpoint::open(path);
  ck.verify();
  EXPECT_EQ(ck.info().step, 3);
  EXPECT_EQ(ck.tensors().at("model.w").shape, (std::vector<int64_t>{kRows, kCols}));
  EXPECT_TRUE(at::equal(ck.read_full("model.w"), global_w()));
  EXPECT_TRUE(at::equal(ck.read_full("model.b"), global_b()));

  // tp3 (padded to 12 rows: 4 per rank), each rank's whole box, and a ZeRO
  // flat range of tp rank 1's box.
  const at::Tensor p12 = padded_w(12);
  for (int t = 0; t < 3; ++t) {
    ShardedState target;
    TensorSlice w;
    w.tensor = at::full({4, kCols}, -1.0f);
    w.global_shape = {kRows, kCols};
    w.box_offset = {4 * t, 0};
    w.box_shape = {4, kCols};
    target["model.w"] = w;
    const auto missing = ck.load_into(target, t, false);
    EXPECT_TRUE(missing.empty());
    EXPECT_TRUE(at::equal(target["model.w"].tensor, p12.narrow(0, 4 * t, 4))) << "tp rank " << t;
  }
  ShardedState zero;
  TensorSlice z;
  z.tensor = at::zeros({12});
  z.global_shape = {kRows, kCols};
  z.box_offset = {4, 0};
  z.box_shape = {4, kCols};
  z.flat_begin = 5;
  z.flat_end = 17;
  zero["model.w"] = z;
  zero["model.b"] = {at::zeros({5}), {5}};
  zero["engine.step"] = {at::zeros({}, at::TensorOptions().dtype(at::kLong)), {}};
  EXPECT_TRUE(ck.load_into(zero, 0, false).empty());
  EXPECT_TRUE(at::equal(zero["model.w"].tensor, p12.narrow(0, 4, 4).reshape({-1}).slice(0, 5, 17)));
  EXPECT_TRUE(at::equal(zero["model.b"].tensor, global_b()));
  EXPECT_EQ(zero["engine.step"].tensor.item<int64_t>(), 7);

  // Rank-specific state: only the same rank of the same layout.
  ShardedState rng;
  TensorSlice r;
  r.tensor = at::zeros({4}, at::TensorOptions().dtype(at::kByte));
  r.global_shape = {4};
  r.per_rank = true;
  rng["rng.stage0.sharded"] = r;
  EXPECT_TRUE(ck.load_into(rng, 5, true).empty());
  EXPECT_EQ(rng["rng.stage0.sharded"].tensor[0].item<int>(), 5);
  EXPECT_EQ(ck.load_into(rng, 5, false), std::vector<std::string>{"rng.stage0.sharded"});

  // A different global shape is refused, naming the tensor.
  ShardedState other;
  other["model.b"] = {at::zeros({6}), {6}};
  try {
    ck.load_into(other, 0, false);
    FAIL() << "another shape was accepted";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("'model.b'"), std::string::npos) << e.what();
  }
}

TEST(Slices, APieceMissingIsRefused) {
  const std::string dir = fresh_dir("missing_piece");
  const RunInfo info = info_for(1, 2);
  ShardedState half;
  TensorSlice w;
  w.tensor = global_w().reshape({-1}).slice(0, 0, 30).clone();
  w.global_shape = {kRows, kCols};
  w.flat_begin = 0;
  w.flat_end = 30;
  half["model.w"] = w;
  write_rank(dir, 1, {}, info);  // rank 1 holds nothing: the second half is lost
  const std::string path = finalize(write_rank(dir, 0, half, info), info);
  const Checkpoint ck = Checkpoint::open(path);
  ShardedState target;
  target["model.w"] = {at::zeros({kRows, kCols}), {kRows, kCols}};
  try {
    ck.load_into(target, 0, false);
    FAIL() << "a half-saved tensor loaded";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("'model.w'"), std::string::npos) << e.what();
  }
}

void flip_byte(const std::string& file, uint64_t offset) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x10);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

// The error of opening, verifying and loading `path`.
std::string failure_of(const std::string& path) {
  try {
    const Checkpoint ck = Checkpoint::open(path);
    ck.verify();
    (void)ck.read_full("model.w");
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "";
}

TEST(Corruption, EveryKindIsDetectedAndNamed) {
  const std::string dir = fresh_dir("corrupt");
  const std::string good = save_source(dir, 1);
  ASSERT_EQ(failure_of(good), "");
  const std::string other_run = save_source(fresh_dir("corrupt_other"), 1, "run1");
  auto copy = [&](const std::string& name) {
    const std::string p = (fs::path(dir) / name).string();
    remove_tree(p);
    fs::copy(good, p, fs::copy_options::recursive);
    return p;
  };
  const uint64_t size = fs::file_size(fs::path(good) / "rank-00003.safetensors");
  for (uint64_t offset : {uint64_t{3}, uint64_t{40}, size - 1}) {  // length field, header, data
    const std::string p = copy("flip" + std::to_string(offset));
    flip_byte((fs::path(p) / "rank-00003.safetensors").string(), offset);
    const std::string e = failure_of(p);
    EXPECT_NE(e.find("rank-00003.safetensors"), std::string::npos) << "offset " << offset << ": " << e;
  }
  {
    const std::string p = copy("truncated");
    fs::resize_file(fs::path(p) / "rank-00005.safetensors", size - 8);
    const std::string e = failure_of(p);
    EXPECT_NE(e.find("rank-00005.safetensors"), std::string::npos) << e;
    EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  }
  {
    const std::string p = copy("missing");
    fs::remove(fs::path(p) / "rank-00002.safetensors");
    const std::string e = failure_of(p);
    EXPECT_NE(e.find("rank-00002.safetensors"), std::string::npos) << e;
    EXPECT_NE(e.find("missing"), std::string::npos) << e;
  }
  {
    const std::string p = copy("foreign_manifest");
    fs::copy_file(fs::path(other_run) / "manifest.json", fs::path(p) / "manifest.json",
                  fs::copy_options::overwrite_existing);
    const std::string e = failure_of(p);
    EXPECT_NE(e.find("manifest.json"), std::string::npos) << e;
    EXPECT_NE(e.find("COMPLETE"), std::string::npos) << e;
  }
  {
    // The manifest and marker of another run: the rank files do not match it.
    const std::string p = copy("foreign_run");
    for (const char* f : {"manifest.json", "COMPLETE"}) {
      fs::copy_file(fs::path(other_run) / f, fs::path(p) / f, fs::copy_options::overwrite_existing);
    }
    const std::string e = failure_of(p);
    EXPECT_NE(e.find(".safetensors"), std::string::npos) << e;
  }
  {
    const std::string p = copy("unfinished");
    fs::remove(fs::path(p) / "COMPLETE");
    const std::string e = failure_of(p);
    EXPECT_NE(e.find("incomplete"), std::string::npos) << e;
  }
  {
    const std::string p = copy("bad_manifest");
    flip_byte((fs::path(p) / "manifest.json").string(), 20);
    EXPECT_NE(failure_of(p).find("manifest.json"), std::string::npos);
  }
  EXPECT_EQ(failure_of(good), "") << "the original was changed";
}

TEST(Atomic, AFullDiskLeavesThePreviousCheckpointNewest) {
  const std::string dir = fresh_dir("enospc");
  save_source(dir, 1);
  inject_write_failure(100);  // the next 100 bytes fit, then ENOSPC
  std::string error;
  try {
    save_source(dir, 2);
  } catch (const CheckpointError& e) {
    error = e.what();
  }
  inject_write_failure(-1);
  EXPECT_NE(error.find("rank-00007.safetensors"), std::string::npos) << error;
  EXPECT_NE(error.find("errno 28"), std::string::npos) << error;
  const auto all = list_checkpoints(dir);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_TRUE(all[0].complete);
  EXPECT_EQ(all[0].step, 1);
  EXPECT_FALSE(all[1].complete);
  EXPECT_EQ(all[1].step, 2);
  EXPECT_EQ(failure_of(all[0].path), "");
  // The same step saved again after the disk has room: complete.
  remove_tree(all[1].path);
  EXPECT_EQ(failure_of(save_source(dir, 2)), "");
}

// A real full file system: a 256 KiB tmpfs (root only; skipped elsewhere).
TEST(Atomic, ARealFullFileSystem) {
  const std::string dir = fresh_dir("tmpfs");
  if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=256k") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here: " << std::strerror(errno);
  }
  struct Unmount {
    std::string d;
    ~Unmount() { ::umount2(d.c_str(), MNT_DETACH); }
  } unmount{dir};
  const std::string first = save_source(dir, 1);
  ShardedState big;
  big["model.big"] = {at::ones({1 << 19}), {1 << 19}};  // 2 MiB
  RunInfo info = info_for(2, 1);
  std::string error;
  try {
    finalize(write_rank(dir, 0, big, info), info);
  } catch (const CheckpointError& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("rank-00000.safetensors"), std::string::npos) << error;
  EXPECT_NE(error.find("No space left on device"), std::string::npos) << error;
  const auto all = list_checkpoints(dir);
  ASSERT_FALSE(all.empty());
  EXPECT_TRUE(all.front().complete);
  EXPECT_EQ(all.front().path, first);
  EXPECT_FALSE(all.back().complete) << "a save that did not fit looks complete";
  EXPECT_EQ(failure_of(first), "");
}

// A rank whose write fails leaves rank-N.failed: rank 0 stops waiting at once.
TEST(Atomic, AFailedRankEndsTheWaitNamingIt) {
  const std::string dir = fresh_dir("failed_rank");
  const RunInfo info = info_for(5, 2);
  const RankWrite w = write_rank(dir, 0, source_rank(0), info);
  {
    std::ofstream failed(fs::path(w.tmp_dir) / "rank-00001.failed");
    failed << "checkpoint: write /x/rank-00001.safetensors: No space left on device [errno 28]\n";
  }
  SaveOptions so;
  so.peer_timeout_s = 60;
  const auto t0 = std::chrono::steady_clock::now();
  std::string error;
  try {
    finalize(w, info, so);
  } catch (const CheckpointError& e) {
    error = e.what();
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  EXPECT_NE(error.find("rank 1"), std::string::npos) << error;
  EXPECT_NE(error.find("errno 28"), std::string::npos) << error;
  EXPECT_FALSE(list_checkpoints(dir).front().complete);
}

TEST(Atomic, RemoveDropsTheMarkerFirst) {
  const std::string dir = fresh_dir("remove");
  const std::string p = save_source(dir, 4);
  remove_checkpoint(p);
  EXPECT_FALSE(fs::exists(p));
  EXPECT_TRUE(list_checkpoints(dir).empty());
}

TEST(Export, OneFileOfFullUnpaddedTensors) {
  const std::string dir = fresh_dir("export");
  const Checkpoint ck = Checkpoint::open(save_source(dir, 2));
  const std::string out = (fs::path(dir) / "model.safetensors").string();
  EXPECT_EQ(export_safetensors(ck, out), 2);
  const auto t = read_safetensors(out);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_TRUE(at::equal(t.at("w"), global_w()));
  EXPECT_TRUE(at::equal(t.at("b"), global_b()));
  // A round trip of a plain state dict, dtypes kept.
  const std::map<std::string, at::Tensor> plain = {
      {"a", at::arange(6, at::TensorOptions().dtype(at::kBFloat16)).reshape({2, 3})},
      {"c", at::ones({3}, at::TensorOptions().dtype(at::kDouble))},
      {"s", at::full({}, 3, at::TensorOptions().dtype(at::kLong))}};
  write_safetensors(out, plain);
  const auto back = read_safetensors(out);
  for (const auto& [k, v] : plain) {
    EXPECT_EQ(back.at(k).scalar_type(), v.scalar_type()) << k;
    EXPECT_TRUE(at::equal(back.at(k), v)) << k;
  }
}

// The buffer-level writer (buffers.h: the one the tensor write_rank and the
// flat states of buffer-level optimizers use) makes an ordinary checkpoint:
// two ranks' flat halves of a 1-D tensor, a whole 2-D box and a replicated
// counter from host buffers read back through Checkpoint, resharded into
// another flat range, with the manifest's state object kept.
TEST(Buffers, FlatStatesAreOrdinaryCheckpoints) {
  const std::string dir = fresh_dir("buffers");
  const std::vector<float> m = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  const std::vector<uint16_t> half = {0x3f80, 0x4000, 0x4040, 0x4080};  // bf16 1, 2, 3, 4 as a 2x2 box
  const int64_t steps = 12;
  RunInfo info = info_for(5, 2);
  info.state = R"({"param_dtype":"bf16"})";
  RankWrite first;
  for (int r = 1; r >= 0; --r) {
    BufferState s;
    BufferSlice flat;
    flat.data = m.data() + 5 * r;
    flat.dtype = "F32";
    flat.shape = {5};
    flat.global_shape = {10};
    flat.flat_begin = 5 * r;
    flat.flat_end = 5 * r + 5;
    s["optim.master"] = flat;
    if (r == 0) {
      BufferSlice box;
      box.data = half.data();
      box.dtype = "BF16";
      box.shape = {2, 2};
      box.global_shape = {2, 2};
      s["model.w"] = box;
      BufferSlice count;
      count.data = &steps;
      count.dtype = dtype_code(DType::kI64);
      count.shape = {1};
      count.global_shape = {1};
      s["optim.step_count"] = count;
    }
    RankWrite w = write_rank_buffers(dir, r, s, info);
    if (r == 0) first = w;
  }
  const Checkpoint ck = Checkpoint::open(finalize(first, info));
  ck.verify();
  EXPECT_EQ(ck.info().state, R"({"param_dtype":"bf16"})");
  EXPECT_TRUE(at::equal(ck.read_full("optim.master"), at::arange(1, 11, at::TensorOptions().dtype(at::kFloat))));
  EXPECT_TRUE(at::equal(ck.read_full("model.w"),
                        at::arange(1, 5, at::TensorOptions().dtype(at::kBFloat16)).reshape({2, 2})));
  EXPECT_EQ(ck.read_full("optim.step_count").item<int64_t>(), steps);
  // Another split: elements [3, 8) as a flat range.
  ShardedState target;
  TensorSlice t;
  t.tensor = at::zeros({5});
  t.global_shape = {10};
  t.flat_begin = 3;
  t.flat_end = 8;
  target["optim.master"] = t;
  EXPECT_TRUE(ck.load_into(target, 0, false).empty());
  EXPECT_TRUE(at::equal(target.at("optim.master").tensor, at::arange(4, 9, at::TensorOptions().dtype(at::kFloat))));
  // The engine's manifests carry no state object: read as "{}".
  EXPECT_EQ(Checkpoint::open(save_source(dir, 6)).info().state, "{}");
  // A whole box reaching past its tensor is refused (only the tensor writer crops).
  BufferState bad;
  BufferSlice past;
  past.data = m.data();
  past.dtype = "F32";
  past.shape = {4};
  past.global_shape = {10};
  past.box_offset = {8};
  past.box_shape = {4};
  bad["x"] = past;
  EXPECT_THROW(write_rank_buffers(dir, 0, bad, info_for(7, 1)), InvalidArgument);
}

}  // namespace
}  // namespace torus::ckpt
