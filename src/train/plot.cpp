// Line-plot rasteriser and a dependency-free PNG encoder (stored deflate).
#include "torus/train/plot.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string_view>

#include "core/log.h"
#include "torus/core/error.h"
#include "train/font5x7.h"

namespace torus::train {
namespace {

using font::kFont5x7;
using font::kFontFirst;
using font::kFontLast;
using font::kGlyphAdvance;
using font::kGlyphHeight;
using font::kGlyphWidth;

constexpr Rgb kWhite{255, 255, 255};
constexpr Rgb kGrid{225, 225, 225};
constexpr Rgb kFrame{60, 60, 60};
constexpr Rgb kText{20, 20, 20};
constexpr int kScale = 2;                      // text is drawn at 2x: 10x14 pixel glyphs
constexpr int kTextH = kGlyphHeight * kScale;  // 14

struct Rect {
  int x0, y0, x1, y1;  // inclusive
  bool contains(int x, int y) const { return x >= x0 && x <= x1 && y >= y0 && y <= y1; }
};

int text_width(std::string_view s, int scale = kScale) {
  return s.empty() ? 0 : (static_cast<int>(s.size()) * kGlyphAdvance - 1) * scale;
}

// Draws `s` with its top-left corner at (x, y); `vertical` rotates it 90
// degrees counter-clockwise (reading bottom to top) inside the box of
// width kGlyphHeight * scale and height text_width(s) whose top-left is (x, y).
void draw_text(Image& img, int x, int y, std::string_view s, Rgb c, bool vertical = false, int scale = kScale) {
  const int length = static_cast<int>(s.size()) * kGlyphAdvance - 1;  // unscaled
  for (size_t i = 0; i < s.size(); ++i) {
    int ch = static_cast<unsigned char>(s[i]);
    if (ch < kFontFirst || ch > kFontLast) ch = '?';
    const uint8_t* glyph = kFont5x7[ch - kFontFirst];
    for (int gx = 0; gx < kGlyphWidth; ++gx) {
      for (int gy = 0; gy < kGlyphHeight; ++gy) {
        if (((glyph[gx] >> gy) & 1) == 0) continue;
        const int u = static_cast<int>(i) * kGlyphAdvance + gx;  // along the text
        for (int dy = 0; dy < scale; ++dy) {
          for (int dx = 0; dx < scale; ++dx) {
            if (vertical) {
              img.set(x + gy * scale + dx, y + (length - 1 - u) * scale + dy, c);
            } else {
              img.set(x + u * scale + dx, y + gy * scale + dy, c);
            }
          }
        }
      }
    }
  }
}

void fill_rect(Image& img, const Rect& r, Rgb c) {
  for (int y = r.y0; y <= r.y1; ++y) {
    for (int x = r.x0; x <= r.x1; ++x) img.set(x, y, c);
  }
}

void stroke_rect(Image& img, const Rect& r, Rgb c) {
  for (int x = r.x0; x <= r.x1; ++x) img.set(x, r.y0, c), img.set(x, r.y1, c);
  for (int y = r.y0; y <= r.y1; ++y) img.set(r.x0, y, c), img.set(r.x1, y, c);
}

// A 2-pixel line (each Bresenham point is a 2x2 block), clipped to `clip`.
void draw_line(Image& img, int x0, int y0, int x1, int y1, Rgb c, const Rect& clip) {
  const int dx = std::abs(x1 - x0), sx = x0 < x1 ? 1 : -1;
  const int dy = -std::abs(y1 - y0), sy = y0 < y1 ? 1 : -1;
  int err = dx + dy;
  while (true) {
    for (int oy = 0; oy < 2; ++oy) {
      for (int ox = 0; ox < 2; ++ox) {
        if (clip.contains(x0 + ox, y0 + oy)) img.set(x0 + ox, y0 + oy, c);
      }
    }
    if (x0 == x1 && y0 == y1) break;
    const int e2 = 2 * err;
    if (e2 >= dy) err += dy, x0 += sx;
    if (e2 <= dx) err += dx, y0 += sy;
  }
}

// "1.0e-5"-style text: one decimal, exponent without '+' or leading zeros.
std::string compact_exponent(double v) {
  std::string s = fmt::format("{:.1e}", v);
  const size_t e = s.find('e');
  std::string exp = s.substr(e + 1);
  const bool neg = exp[0] == '-';
  size_t k = (exp[0] == '-' || exp[0] == '+') ? 1 : 0;
  while (k + 1 < exp.size() && exp[k] == '0') ++k;
  return s.substr(0, e) + "e" + (neg ? "-" : "") + exp.substr(k);
}

void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  out.push_back(static_cast<uint8_t>(v >> 24));
  out.push_back(static_cast<uint8_t>(v >> 16));
  out.push_back(static_cast<uint8_t>(v >> 8));
  out.push_back(static_cast<uint8_t>(v));
}

void put_chunk(std::vector<uint8_t>& out, const char (&type)[5], std::span<const uint8_t> data) {
  put_u32(out, static_cast<uint32_t>(data.size()));
  const size_t start = out.size();
  out.insert(out.end(), type, type + 4);
  out.insert(out.end(), data.begin(), data.end());
  put_u32(out, crc32(std::span<const uint8_t>(out.data() + start, out.size() - start)));
}

}  // namespace

// --- Image ----------------------------------------------------------------------

Image::Image(int w, int h, Rgb fill) : width(w), height(h), rgb(static_cast<size_t>(w) * h * 3) {
  for (size_t i = 0; i < rgb.size(); i += 3) rgb[i] = fill.r, rgb[i + 1] = fill.g, rgb[i + 2] = fill.b;
}

Rgb Image::at(int x, int y) const {
  const size_t i = (static_cast<size_t>(y) * width + x) * 3;
  return {rgb[i], rgb[i + 1], rgb[i + 2]};
}

void Image::set(int x, int y, Rgb c) {
  if (x < 0 || y < 0 || x >= width || y >= height) return;
  const size_t i = (static_cast<size_t>(y) * width + x) * 3;
  rgb[i] = c.r, rgb[i + 1] = c.g, rgb[i + 2] = c.b;
}

// --- ticks ----------------------------------------------------------------------

AxisTicks nice_ticks(double lo, double hi, int target) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) lo = 0, hi = 1;
  if (hi < lo) std::swap(lo, hi);
  if (hi == lo) {
    const double d = lo == 0 ? 1.0 : std::fabs(lo) * 0.1;
    lo -= d, hi += d;
  }
  const double raw = (hi - lo) / std::max(target, 1);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  const double mult = norm <= 1 + 1e-9 ? 1 : norm <= 2 + 1e-9 ? 2 : norm <= 5 + 1e-9 ? 5 : 10;
  AxisTicks t;
  t.step = mult * mag;
  t.lo = std::floor(lo / t.step + 1e-9) * t.step;
  t.hi = std::ceil(hi / t.step - 1e-9) * t.step;
  const int64_t n = std::llround((t.hi - t.lo) / t.step);
  for (int64_t k = 0; k <= n; ++k) {
    double v = t.lo + static_cast<double>(k) * t.step;
    if (std::fabs(v) < t.step * 1e-9) v = 0;  // no "-0"
    t.values.push_back(v);
  }
  return t;
}

std::string format_tick(double value, double step) {
  if (std::fabs(value) < std::fabs(step) * 1e-9) value = 0;
  const int decimals = std::max(0, static_cast<int>(-std::floor(std::log10(std::fabs(step)) + 1e-9)));
  if (decimals > 4 || std::fabs(value) >= 1e7) return value == 0 ? "0" : compact_exponent(value);
  return fmt::format("{:.{}f}", value, decimals);
}

// --- rendering ------------------------------------------------------------------

Image render_line_plot(const PlotSpec& spec) {
  TORUS_CHECK(spec.width >= 200 && spec.height >= 150 && spec.width <= 16384 && spec.height <= 16384, InvalidArgument,
              "plot '{}': size {}x{} outside [200..16384]x[150..16384]", spec.title, spec.width, spec.height);
  double xlo = std::numeric_limits<double>::infinity(), xhi = -xlo, ylo = xlo, yhi = -xlo;
  for (const PlotSeries& s : spec.series) {
    TORUS_CHECK(s.xs.size() == s.ys.size(), InvalidArgument, "plot '{}': series '{}' has {} xs but {} ys", spec.title,
                s.name, s.xs.size(), s.ys.size());
    for (size_t i = 0; i < s.xs.size(); ++i) {
      if (!std::isfinite(s.xs[i]) || !std::isfinite(s.ys[i])) continue;
      xlo = std::min(xlo, s.xs[i]), xhi = std::max(xhi, s.xs[i]);
      ylo = std::min(ylo, s.ys[i]), yhi = std::max(yhi, s.ys[i]);
    }
  }
  const AxisTicks xt = nice_ticks(xlo, xhi, 7);
  const AxisTicks yt = nice_ticks(ylo, yhi, 6);
  std::vector<std::string> ylabels, xlabels;
  int ylabel_w = 0, xlabel_w = 0;
  for (double v : yt.values)
    ylabels.push_back(format_tick(v, yt.step)), ylabel_w = std::max(ylabel_w, text_width(ylabels.back()));
  for (double v : xt.values)
    xlabels.push_back(format_tick(v, xt.step)), xlabel_w = std::max(xlabel_w, text_width(xlabels.back()));

  const int W = spec.width, H = spec.height;
  Image img(W, H, kWhite);
  const int left = 10 + (spec.y_label.empty() ? 0 : kTextH + 12) + ylabel_w + 10;
  const int top = spec.title.empty() ? 20 : 14 + kTextH + 16;
  const int bottom = 6 + 8 + kTextH + (spec.x_label.empty() ? 10 : 12 + kTextH + 10);
  const int right = std::max(30, xlabel_w / 2 + 10);
  const Rect plot{left, top, W - right - 1, H - bottom - 1};
  TORUS_CHECK(plot.x1 - plot.x0 >= 50 && plot.y1 - plot.y0 >= 50, InvalidArgument,
              "plot '{}': {}x{} leaves no room for the plot area", spec.title, W, H);
  const Rect inner{plot.x0 + 1, plot.y0 + 1, plot.x1 - 1, plot.y1 - 1};
  auto map_x = [&](double v) {
    return plot.x0 + static_cast<int>(std::lround((v - xt.lo) / (xt.hi - xt.lo) * (plot.x1 - plot.x0)));
  };
  auto map_y = [&](double v) {
    return plot.y1 - static_cast<int>(std::lround((v - yt.lo) / (yt.hi - yt.lo) * (plot.y1 - plot.y0)));
  };

  // Grid.
  for (double v : xt.values) {
    const int x = map_x(v);
    for (int y = inner.y0; y <= inner.y1; ++y) img.set(x, y, kGrid);
  }
  for (double v : yt.values) {
    const int y = map_y(v);
    for (int x = inner.x0; x <= inner.x1; ++x) img.set(x, y, kGrid);
  }

  // Series.
  for (const PlotSeries& s : spec.series) {
    int px = 0, py = 0, points = 0;
    for (size_t i = 0; i < s.xs.size(); ++i) {
      if (!std::isfinite(s.xs[i]) || !std::isfinite(s.ys[i])) continue;
      const int x = map_x(s.xs[i]), y = map_y(s.ys[i]);
      if (points > 0) draw_line(img, px, py, x, y, s.color, inner);
      px = x, py = y, ++points;
    }
    if (points == 1)
      fill_rect(img,
                {std::max(px - 2, inner.x0), std::max(py - 2, inner.y0), std::min(px + 3, inner.x1),
                 std::min(py + 3, inner.y1)},
                s.color);
  }

  // Frame, ticks and tick labels.
  stroke_rect(img, plot, kFrame);
  const int x_spacing = xt.values.size() > 1 ? map_x(xt.values[1]) - map_x(xt.values[0]) : W;
  const int x_every = std::max(1, (xlabel_w + 12 + x_spacing - 1) / std::max(x_spacing, 1));
  for (size_t k = 0; k < xt.values.size(); ++k) {
    const int x = map_x(xt.values[k]);
    for (int d = 1; d <= 6; ++d) img.set(x, plot.y1 + d, kFrame);
    if (k % x_every == 0) draw_text(img, x - text_width(xlabels[k]) / 2, plot.y1 + 6 + 8, xlabels[k], kText);
  }
  for (size_t k = 0; k < yt.values.size(); ++k) {
    const int y = map_y(yt.values[k]);
    for (int d = 1; d <= 6; ++d) img.set(plot.x0 - d, y, kFrame);
    draw_text(img, plot.x0 - 10 - text_width(ylabels[k]), y - kTextH / 2, ylabels[k], kText);
  }

  // Title and axis labels.
  if (!spec.title.empty()) draw_text(img, (W - text_width(spec.title)) / 2, 14, spec.title, kText);
  if (!spec.x_label.empty()) {
    draw_text(img, (plot.x0 + plot.x1 - text_width(spec.x_label)) / 2, H - 10 - kTextH, spec.x_label, kText);
  }
  if (!spec.y_label.empty()) {
    draw_text(img, 10, (plot.y0 + plot.y1 - text_width(spec.y_label)) / 2, spec.y_label, kText, /*vertical=*/true);
  }

  // Legend, in the corner that covers the fewest series pixels.
  int name_w = 0, named = 0;
  for (const PlotSeries& s : spec.series) name_w = std::max(name_w, text_width(s.name)), named += !s.name.empty();
  if (named > 0) {
    const int row_h = kTextH + 8;
    const int box_w = 10 + 28 + 8 + name_w + 10;
    const int box_h = 6 + static_cast<int>(spec.series.size()) * row_h;
    const int m = 10;
    const std::array<Rect, 4> corners{{
        {inner.x1 - m - box_w, inner.y0 + m, inner.x1 - m, inner.y0 + m + box_h},  // top right
        {inner.x0 + m, inner.y0 + m, inner.x0 + m + box_w, inner.y0 + m + box_h},  // top left
        {inner.x1 - m - box_w, inner.y1 - m - box_h, inner.x1 - m, inner.y1 - m},  // bottom right
        {inner.x0 + m, inner.y1 - m - box_h, inner.x0 + m + box_w, inner.y1 - m},  // bottom left
    }};
    size_t best = 0;
    int64_t best_count = std::numeric_limits<int64_t>::max();
    for (size_t c = 0; c < corners.size(); ++c) {
      int64_t count = 0;
      for (int y = corners[c].y0; y <= corners[c].y1; ++y) {
        for (int x = corners[c].x0; x <= corners[c].x1; ++x) {
          if (x < 0 || y < 0 || x >= W || y >= H) continue;
          const Rgb p = img.at(x, y);
          count += !(p == kWhite) && !(p == kGrid);
        }
      }
      if (count < best_count) best_count = count, best = c;
    }
    const Rect box = corners[best];
    fill_rect(img, box, kWhite);
    stroke_rect(img, box, kFrame);
    for (size_t i = 0; i < spec.series.size(); ++i) {
      const int y = box.y0 + 6 + static_cast<int>(i) * row_h;
      const int mid = y + kTextH / 2 - 1;
      draw_line(img, box.x0 + 10, mid, box.x0 + 10 + 28, mid, spec.series[i].color, box);
      draw_text(img, box.x0 + 10 + 28 + 8, y, spec.series[i].name, kText);
    }
  }
  return img;
}

// --- PNG ------------------------------------------------------------------------

uint32_t crc32(std::span<const uint8_t> data, uint32_t crc) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t n = 0; n < 256; ++n) {
      uint32_t c = n;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[n] = c;
    }
    return t;
  }();
  crc = ~crc;
  for (uint8_t b : data) crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

uint32_t adler32(std::span<const uint8_t> data, uint32_t adler) {
  constexpr uint32_t kMod = 65521;
  constexpr size_t kNMax = 5552;  // the most bytes before the sums can overflow 32 bits
  uint32_t a = adler & 0xFFFF, b = adler >> 16;
  size_t i = 0;
  while (i < data.size()) {
    const size_t end = std::min(data.size(), i + kNMax);
    for (; i < end; ++i) a += data[i], b += a;
    a %= kMod, b %= kMod;
  }
  return (b << 16) | a;
}

std::vector<uint8_t> encode_png(const Image& image) {
  TORUS_CHECK(
      image.width > 0 && image.height > 0 && image.rgb.size() == static_cast<size_t>(image.width) * image.height * 3,
      InvalidArgument, "encode_png: bad image {}x{} with {} bytes", image.width, image.height, image.rgb.size());
  // Scanlines, each preceded by filter type 0 (None).
  const size_t row = static_cast<size_t>(image.width) * 3;
  std::vector<uint8_t> raw;
  raw.reserve((row + 1) * image.height);
  for (int y = 0; y < image.height; ++y) {
    raw.push_back(0);
    raw.insert(raw.end(), image.rgb.begin() + y * row, image.rgb.begin() + (y + 1) * row);
  }
  // zlib stream: header (deflate, 32K window, no dictionary; 0x7801 % 31 == 0),
  // stored blocks of at most 65535 bytes, Adler-32 of the raw data.
  std::vector<uint8_t> z{0x78, 0x01};
  size_t pos = 0;
  do {
    const size_t n = std::min<size_t>(65535, raw.size() - pos);
    const bool final = pos + n == raw.size();
    z.push_back(final ? 1 : 0);  // BFINAL, BTYPE = 00
    z.push_back(static_cast<uint8_t>(n)), z.push_back(static_cast<uint8_t>(n >> 8));
    z.push_back(static_cast<uint8_t>(~n)), z.push_back(static_cast<uint8_t>(~n >> 8));
    z.insert(z.end(), raw.begin() + pos, raw.begin() + pos + n);
    pos += n;
  } while (pos < raw.size());
  put_u32(z, adler32(raw));

  std::vector<uint8_t> png{0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  std::vector<uint8_t> ihdr;
  put_u32(ihdr, static_cast<uint32_t>(image.width));
  put_u32(ihdr, static_cast<uint32_t>(image.height));
  ihdr.insert(ihdr.end(), {8, 2, 0, 0, 0});  // 8-bit, RGB, deflate, adaptive filters, no interlace
  put_chunk(png, "IHDR", ihdr);
  constexpr size_t kIdatMax = 1 << 18;
  for (size_t off = 0; off < z.size(); off += kIdatMax) {
    put_chunk(png, "IDAT", std::span<const uint8_t>(z.data() + off, std::min(kIdatMax, z.size() - off)));
  }
  put_chunk(png, "IEND", {});
  return png;
}

void write_line_plot_png(const std::string& path, const PlotSpec& spec) {
  const std::vector<uint8_t> png = encode_png(render_line_plot(spec));
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    const int err = errno;
    throw Error(fmt::format("cannot write plot '{}': {}", tmp, ::torus::detail::errno_string(err)));
  }
  const bool wrote = std::fwrite(png.data(), 1, png.size(), f) == png.size();
  int err = errno;
  const bool closed = std::fclose(f) == 0;
  if (!closed && wrote) err = errno;
  if (!wrote || !closed || std::rename(tmp.c_str(), path.c_str()) != 0) {
    if (wrote && closed) err = errno;
    ::unlink(tmp.c_str());
    throw Error(fmt::format("cannot write plot '{}': {}", path, ::torus::detail::errno_string(err)));
  }
}

}  // namespace torus::train
