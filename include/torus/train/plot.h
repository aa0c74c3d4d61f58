// torus/train/plot.h — line plots of training curves written as PNG files,
// with no dependency beyond the standard library: a small rasteriser with a
// built-in 5x7 bitmap font, and a PNG encoder (zlib stream of deflate
// "stored" blocks, so no compression library; a 900x560 plot is ~1.5 MB).
//
//   PlotSpec spec{.title = "loss", .x_label = "step", .y_label = "loss"};
//   spec.series.push_back({"train", {31, 119, 180}, steps, train_loss});
//   spec.series.push_back({"val", {255, 127, 14}, eval_steps, val_loss});
//   write_line_plot_png("run/loss.png", spec);
//
// The image: white background, a plot frame with tick marks and grid lines
// at "nice" values (1, 2 or 5 x 10^k), tick labels, axis labels (the y label
// reads bottom to top), the title, each series as a 2-pixel polyline without
// anti-aliasing, and a legend box naming the series in the emptiest corner of
// the plot. Non-finite points are skipped (the line joins the finite ones).
// Text outside ASCII 32..126 is drawn as '?'.
//
// Everything here is pure and thread safe except write_line_plot_png, which
// blocks on file I/O.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace torus::train {

struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
  bool operator==(const Rgb&) const = default;
};

struct PlotSeries {
  std::string name;
  Rgb color;
  std::vector<double> xs;
  std::vector<double> ys;  // same length as xs
};

struct PlotSpec {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::vector<PlotSeries> series;
  int width = 900;   // pixels, >= 200
  int height = 560;  // pixels, >= 150
};

// An 8-bit RGB image, row major, 3 bytes per pixel.
struct Image {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> rgb;

  Image() = default;
  Image(int w, int h, Rgb fill);
  Rgb at(int x, int y) const;
  // Sets a pixel; coordinates outside the image are ignored.
  void set(int x, int y, Rgb c);
};

// Tick positions for an axis covering [lo, hi] with about `target` ticks:
// step = 1, 2, 5 or 10 x 10^k (the smallest not below (hi - lo) / target),
// lo/hi widened to multiples of the step. An empty or non-finite range
// becomes [0, 1]; lo == hi is widened by 10% of |lo| (or 1 when lo is 0).
struct AxisTicks {
  double lo = 0;
  double hi = 1;
  double step = 1;
  std::vector<double> values;  // lo, lo + step, ..., hi
};
AxisTicks nice_ticks(double lo, double hi, int target = 6);

// A tick value as text with the decimals its step needs ("0.25", "100"), or a
// compact exponent ("5.0e-5") for very small steps or large values.
std::string format_tick(double value, double step);

// Renders the plot. Throws InvalidArgument if a series' xs and ys differ in
// length or the size is below the minimum.
Image render_line_plot(const PlotSpec& spec);

// The image as a PNG file's bytes (8-bit RGB, filter 0 on every row, IDAT
// holding a zlib stream of stored deflate blocks).
std::vector<uint8_t> encode_png(const Image& image);

// Renders and writes `path` atomically: to path + ".tmp", then rename.
// Throws InvalidArgument as render_line_plot; torus::Error naming the path
// and errno's text if the file cannot be written.
void write_line_plot_png(const std::string& path, const PlotSpec& spec);

// The checksums the PNG format uses (exposed for tests): CRC-32 (ISO-HDLC,
// as zlib's crc32) and Adler-32.
uint32_t crc32(std::span<const uint8_t> data, uint32_t crc = 0);
uint32_t adler32(std::span<const uint8_t> data, uint32_t adler = 1);

}  // namespace torus::train
