// torus/run/lr_schedule.h — the learning-rate schedule of torus-train:
// linear warm-up, then cosine decay to a floor. LibTorch-free, pure function
// of the step, so every rank computes the same value with no communication.
//
// With P = peak, M = min, W = warmup_steps, T = total_steps, D = T - 1 - W:
//
//   lr(s) = P * (s + 1) / W                                   0 <= s < W
//   lr(s) = M + (P - M) * (1 + cos(pi * (s - W) / D)) / 2     W <= s <= T - 1   (D >= 1)
//   lr(s) = M                                                 s >= T (and s > W when D == 0)
//
// So warm-up reaches P at its last step (s = W - 1, when W > 0), decay starts
// at P on step W and reaches exactly M on step T - 1. With D == 0 (W == T - 1)
// step W is P and every later step M; with W == T every step of the run is
// warm-up.
#pragma once

#include <cstdint>

namespace torus::run {

struct LrSchedule {
  double peak = 3e-4;        // P: the rate at the end of warm-up
  double min = 3e-5;         // M: the floor reached at total_steps - 1
  int64_t warmup_steps = 0;  // W: linear warm-up steps (0: none)
  int64_t total_steps = 1;   // T: steps of the run

  // Throws torus::InvalidArgument, naming the field and values, unless
  // 0 <= min <= peak (both finite), total_steps >= 1 and
  // 0 <= warmup_steps <= total_steps.
  void validate() const;

  // The rate for 0-based `step` (formula above). Validates first; throws
  // InvalidArgument for a negative step. Thread safe (const, no state).
  double at(int64_t step) const;
};

}  // namespace torus::run
