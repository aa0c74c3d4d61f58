// Plots: nice tick values, tick labels, the checksum functions against their
// published check values, and the PNG decoded here by an independent reader
// (chunk CRCs, zlib header, stored-block inflate, Adler-32, filter bytes)
// with pixel checks of the series, NaN skipping, legend and text; the atomic
// file write; and, where python3 is present, zlib's own decoder (and
// matplotlib's reader if installed).
#include "torus/train/plot.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "torus/core/error.h"

namespace torus::train {
namespace {
namespace fs = std::filesystem;

constexpr Rgb kRed{214, 39, 40};
constexpr Rgb kBlue{31, 119, 180};
constexpr Rgb kGreen{44, 160, 44};

// --- an independent PNG reader (stored deflate blocks only) ---------------------

uint32_t be32(const std::vector<uint8_t>& b, size_t at) {
  return (uint32_t{b[at]} << 24) | (uint32_t{b[at + 1]} << 16) | (uint32_t{b[at + 2]} << 8) | b[at + 3];
}

// Bitwise CRC-32 (reflected, polynomial 0xEDB88320), no table.
uint32_t slow_crc32(const uint8_t* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1)));
  }
  return ~c;
}

uint32_t slow_adler32(const std::vector<uint8_t>& d) {
  uint64_t a = 1, b = 0;
  for (uint8_t x : d) a = (a + x) % 65521, b = (b + a) % 65521;
  return static_cast<uint32_t>((b << 16) | a);
}

struct Decoded {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;  // without filter bytes
  std::vector<std::string> chunk_types;
};

Decoded decode_png(const std::vector<uint8_t>& png) {
  Decoded out;
  const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  EXPECT_TRUE(png.size() > 8 && std::equal(sig, sig + 8, png.begin()));
  std::vector<uint8_t> z;
  size_t pos = 8;
  while (pos + 12 <= png.size()) {
    const uint32_t len = be32(png, pos);
    const std::string type(png.begin() + pos + 4, png.begin() + pos + 8);
    EXPECT_LE(pos + 12 + len, png.size());
    EXPECT_EQ(be32(png, pos + 8 + len), slow_crc32(png.data() + pos + 4, len + 4)) << "CRC of " << type;
    out.chunk_types.push_back(type);
    if (type == "IHDR") {
      EXPECT_EQ(len, 13u);
      out.width = static_cast<int>(be32(png, pos + 8));
      out.height = static_cast<int>(be32(png, pos + 12));
      EXPECT_EQ(png[pos + 16], 8);  // bit depth
      EXPECT_EQ(png[pos + 17], 2);  // RGB
      EXPECT_EQ(png[pos + 18], 0);
      EXPECT_EQ(png[pos + 19], 0);
      EXPECT_EQ(png[pos + 20], 0);
    } else if (type == "IDAT") {
      z.insert(z.end(), png.begin() + pos + 8, png.begin() + pos + 8 + len);
    }
    pos += 12 + len;
  }
  EXPECT_EQ(pos, png.size());
  // zlib: CM = 8, (CMF * 256 + FLG) % 31 == 0, no preset dictionary.
  EXPECT_GE(z.size(), 6u);
  EXPECT_EQ(z[0] & 0x0F, 8);
  EXPECT_EQ((z[0] * 256 + z[1]) % 31, 0);
  EXPECT_EQ(z[1] & 0x20, 0);
  std::vector<uint8_t> raw;
  size_t p = 2;
  bool final = false;
  while (!final) {
    final = z[p] & 1;
    EXPECT_EQ((z[p] >> 1) & 3, 0) << "not a stored block";
    const size_t n = z[p + 1] | (z[p + 2] << 8);
    const size_t nn = z[p + 3] | (z[p + 4] << 8);
    EXPECT_EQ(n ^ 0xFFFF, nn);
    raw.insert(raw.end(), z.begin() + p + 5, z.begin() + p + 5 + n);
    p += 5 + n;
  }
  EXPECT_EQ(p + 4, z.size());
  EXPECT_EQ(be32(z, p), slow_adler32(raw));
  const size_t stride = static_cast<size_t>(out.width) * 3 + 1;
  EXPECT_EQ(raw.size(), stride * out.height);
  for (int y = 0; y < out.height; ++y) {
    EXPECT_EQ(raw[y * stride], 0) << "filter byte of row " << y;
    out.rgb.insert(out.rgb.end(), raw.begin() + y * stride + 1, raw.begin() + (y + 1) * stride);
  }
  return out;
}

Rgb pixel(const Decoded& d, int x, int y) {
  const size_t i = (static_cast<size_t>(y) * d.width + x) * 3;
  return {d.rgb[i], d.rgb[i + 1], d.rgb[i + 2]};
}

PlotSpec loss_spec() {
  PlotSpec spec;
  spec.title = "Training loss";
  spec.x_label = "step";
  spec.y_label = "loss (nats)";
  PlotSeries train{"train", kRed, {}, {}};
  for (int i = 0; i < 100; ++i) train.xs.push_back(i), train.ys.push_back(5 * std::exp(-i / 30.0) + 1);
  PlotSeries val{"val", kBlue, {}, {}};
  for (int i = 0; i < 100; i += 10)
    val.xs.push_back(i), val.ys.push_back(i == 50 ? NAN : 5 * std::exp(-i / 30.0) + 1.2);
  PlotSeries none{"none", kGreen, {1, 2, 3}, {NAN, NAN, INFINITY}};
  spec.series = {train, val, none};
  return spec;
}

// --- tests ----------------------------------------------------------------------

TEST(Plot, NiceTicks) {
  AxisTicks t = nice_ticks(0, 97, 6);  // raw step 16.2 -> 20
  EXPECT_DOUBLE_EQ(t.step, 20);
  EXPECT_DOUBLE_EQ(t.lo, 0);
  EXPECT_DOUBLE_EQ(t.hi, 100);
  EXPECT_EQ(t.values, (std::vector<double>{0, 20, 40, 60, 80, 100}));

  t = nice_ticks(1.37, 5.52, 6);  // raw 0.69 -> 1
  EXPECT_DOUBLE_EQ(t.step, 1);
  EXPECT_DOUBLE_EQ(t.lo, 1);
  EXPECT_DOUBLE_EQ(t.hi, 6);
  EXPECT_EQ(t.values.size(), 6u);

  t = nice_ticks(0.00012, 0.00031, 5);  // raw 3.8e-5 -> 5e-5
  EXPECT_NEAR(t.step, 5e-5, 1e-18);
  EXPECT_NEAR(t.lo, 1e-4, 1e-18);
  EXPECT_NEAR(t.hi, 3.5e-4, 1e-18);
  EXPECT_EQ(t.values.size(), 6u);

  t = nice_ticks(-3, 2, 5);  // raw 1 -> 1
  EXPECT_DOUBLE_EQ(t.step, 1);
  EXPECT_EQ(t.values.front(), -3);
  EXPECT_EQ(t.values.back(), 2);
  EXPECT_FALSE(std::signbit(t.values[3]));  // exactly 0, not -0

  t = nice_ticks(5, 5, 6);  // widened to [4.5, 5.5]; raw 0.167 -> 0.2
  EXPECT_NEAR(t.step, 0.2, 1e-12);
  EXPECT_NEAR(t.lo, 4.4, 1e-12);
  EXPECT_NEAR(t.hi, 5.6, 1e-12);

  t = nice_ticks(INFINITY, -INFINITY, 6);  // no data
  EXPECT_DOUBLE_EQ(t.lo, 0);
  EXPECT_DOUBLE_EQ(t.hi, 1);
  EXPECT_NEAR(t.step, 0.2, 1e-12);
}

TEST(Plot, TickLabels) {
  EXPECT_EQ(format_tick(100, 20), "100");
  EXPECT_EQ(format_tick(0.25, 0.05), "0.25");
  EXPECT_EQ(format_tick(2, 0.5), "2.0");
  EXPECT_EQ(format_tick(1e-17, 0.1), "0.0");
  EXPECT_EQ(format_tick(-1.5, 0.5), "-1.5");
  EXPECT_EQ(format_tick(1e-4, 5e-5), "1.0e-4");
  EXPECT_EQ(format_tick(0, 5e-5), "0");
  EXPECT_EQ(format_tick(2e7, 5e6), "2.0e7");
}

TEST(Plot, ChecksumCheckValues) {
  const std::string s = "123456789";
  const std::vector<uint8_t> b(s.begin(), s.end());
  EXPECT_EQ(crc32(b), 0xCBF43926u);  // the CRC-32/ISO-HDLC check value
  const std::string w = "Wikipedia";
  const std::vector<uint8_t> wb(w.begin(), w.end());
  EXPECT_EQ(adler32(wb), 0x11E60398u);
  // Incremental use equals one pass.
  EXPECT_EQ(crc32(std::span(b).subspan(4), crc32(std::span(b).first(4))), 0xCBF43926u);
  EXPECT_EQ(adler32(std::span(wb).subspan(3), adler32(std::span(wb).first(3))), 0x11E60398u);
  // Adler-32 over more than its 5552-byte reduction block.
  std::vector<uint8_t> big(100000);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 13 + 7);
  EXPECT_EQ(adler32(big), slow_adler32(big));
  EXPECT_EQ(crc32(big), slow_crc32(big.data(), big.size()));
}

TEST(Plot, SmallImageRoundTrips) {
  Image img(3, 2, Rgb{1, 2, 3});
  img.set(2, 1, Rgb{200, 100, 50});
  img.set(5, 5, Rgb{9, 9, 9});  // outside: ignored
  Decoded d = decode_png(encode_png(img));
  EXPECT_EQ(d.width, 3);
  EXPECT_EQ(d.height, 2);
  EXPECT_EQ(d.rgb, img.rgb);
  EXPECT_EQ(d.chunk_types, (std::vector<std::string>{"IHDR", "IDAT", "IEND"}));
}

TEST(Plot, LossPlotDecodesAndShowsTheSeries) {
  const PlotSpec spec = loss_spec();
  const Image img = render_line_plot(spec);
  const std::vector<uint8_t> png = encode_png(img);
  Decoded d = decode_png(png);
  ASSERT_EQ(d.width, 900);
  ASSERT_EQ(d.height, 560);
  EXPECT_EQ(d.rgb, img.rgb);
  EXPECT_EQ(d.chunk_types.front(), "IHDR");
  EXPECT_EQ(d.chunk_types.back(), "IEND");
  EXPECT_GT(d.chunk_types.size(), 3u);  // ~1.5 MB of stored data spans several IDAT chunks

  int red = 0, blue = 0, green = 0, text = 0, title_text = 0;
  int red_min_x = d.width, red_max_x = -1, red_y_at_min = 0, red_y_at_max = 0;
  for (int y = 0; y < d.height; ++y) {
    for (int x = 0; x < d.width; ++x) {
      const Rgb p = pixel(d, x, y);
      if (p == kRed) {
        ++red;
        if (x < red_min_x) red_min_x = x, red_y_at_min = y;
        if (x > red_max_x) red_max_x = x, red_y_at_max = y;
      }
      blue += p == kBlue;
      green += p == kGreen;
      const bool dark = p.r < 80 && p.g < 80 && p.b < 80;
      text += dark;
      title_text += dark && y < 40;
    }
  }
  EXPECT_EQ(pixel(d, 2, 2), (Rgb{255, 255, 255}));  // background
  // The train curve crosses most of the plot's width, falling left to right.
  EXPECT_GT(red, 800);
  EXPECT_GT(red_max_x - red_min_x, 600);
  EXPECT_LT(red_y_at_min, red_y_at_max - 200);
  // The val series is drawn across its NaN point.
  EXPECT_GT(blue, 500);
  // The all-NaN series shows only its legend sample: a 2-pixel line 28 steps
  // long drawn with 2x2 blocks -> 30 x 2 pixels.
  EXPECT_EQ(green, 60);
  EXPECT_GT(title_text, 50);
  EXPECT_GT(text, 1000);
}

TEST(Plot, EdgeCasesRender) {
  PlotSpec spec;  // no title, labels or series
  EXPECT_NO_THROW(render_line_plot(spec));
  spec.series.push_back({"one point", kRed, {3}, {0.5}});
  const Image img = render_line_plot(spec);
  int red = 0;
  for (int y = 0; y < img.height; ++y) {
    for (int x = 0; x < img.width; ++x) red += img.at(x, y) == kRed;
  }
  EXPECT_EQ(red, 36 + 60);  // a 6x6 marker plus the legend sample
  spec.series.push_back({"bad", kBlue, {1, 2}, {1}});
  EXPECT_THROW(render_line_plot(spec), InvalidArgument);
  PlotSpec tiny;
  tiny.width = 100;
  EXPECT_THROW(render_line_plot(tiny), InvalidArgument);
}

TEST(Plot, WritesAtomicallyAndPythonAgrees) {
  char tmpl[] = "/tmp/torus_plot_XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  const std::string path = dir + "/loss.png";
  const PlotSpec spec = loss_spec();
  write_line_plot_png(path, spec);
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(bytes, encode_png(render_line_plot(spec)));

  try {
    write_line_plot_png(dir + "/no/such/dir/x.png", spec);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/no/such/dir/x.png"), std::string::npos) << e.what();
  }

  if (std::system("python3 -c 'import zlib' >/dev/null 2>&1") != 0) {
    fs::remove_all(dir);
    GTEST_SKIP() << "no python3";
  }
  const std::string script = dir + "/check.py";
  std::ofstream(script) << R"(import struct, sys, zlib
data = open(sys.argv[1], 'rb').read()
assert data[:8] == b'\x89PNG\r\n\x1a\n'
pos, idat, types = 8, b'', []
while pos < len(data):
    n, = struct.unpack('>I', data[pos:pos + 4])
    t, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
    crc, = struct.unpack('>I', data[pos + 8 + n:pos + 12 + n])
    assert zlib.crc32(t + body) & 0xffffffff == crc, t
    types.append(t)
    if t == b'IHDR':
        w, h, depth, color, _, _, _ = struct.unpack('>IIBBBBB', body)
    if t == b'IDAT':
        idat += body
    pos += 12 + n
assert types[0] == b'IHDR' and types[-1] == b'IEND'
raw = zlib.decompress(idat)
assert len(raw) == h * (1 + 3 * w), len(raw)
extra = ''
try:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.image
    img = matplotlib.image.imread(sys.argv[1])
    assert img.shape[:2] == (h, w), img.shape
    extra = ' matplotlib'
except ImportError:
    pass
print('ok', w, h, depth, color, extra)
)";
  const std::string out = dir + "/out.txt";
  const int rc = std::system(("python3 " + script + " " + path + " > " + out + " 2>&1").c_str());
  std::ifstream res(out);
  std::stringstream ss;
  ss << res.rdbuf();
  EXPECT_EQ(rc, 0) << ss.str();
  EXPECT_EQ(ss.str().rfind("ok 900 560 8 2", 0), 0u) << ss.str();
  std::printf("python check: %s", ss.str().c_str());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace torus::train
