// The hardware table (torus/device/hardware.h), parsed from the JSON text
// the build embeds (hardware_table.cpp.in).
#include "torus/device/hardware.h"

#include <nlohmann/json.hpp>

#include "core/log.h"

namespace torus::device {

extern const char* const kHardwareTableJson;  // generated: hardware_table.cpp

namespace {

using Json = nlohmann::json;

constexpr double kGB = 1e9;
constexpr double kT = 1e12;

struct Table {
  std::vector<DeviceSpec> devices;
  std::vector<Hardware> machines;
};

// The field `key` of `row` (named `where` in errors), of type T.
template <typename T>
T field(const Json& row, const char* key, const std::string& where) {
  auto it = row.find(key);
  TORUS_CHECK(it != row.end(), Error, "hardware table: {} has no '{}'", where, key);
  try {
    return it->get<T>();
  } catch (const Json::exception& e) {
    throw Error(fmt::format("hardware table: {}.{}: {}", where, key, e.what()));
  }
}

DeviceSpec parse_device(const Json& row) {
  DeviceSpec d;
  d.name = field<std::string>(row, "name", "a device");
  const std::string where = "device '" + d.name + "'";
  d.kind = field<std::string>(row, "kind", where);
  d.description = field<std::string>(row, "description", where);
  d.match = field<std::vector<std::string>>(row, "match", where);
  const Json peaks = field<Json>(row, "dense_tflops", where);
  TORUS_CHECK(peaks.is_object(), Error, "hardware table: {}.dense_tflops is not an object", where);
  auto peak = [&](const char* key) { return peaks.contains(key) ? field<double>(peaks, key, where) * kT : 0.0; };
  d.peak_flops_bf16 = peak("bf16");
  d.peak_flops_fp16 = peak("fp16");
  d.peak_flops_32 = peak("f32");
  d.peak_flops_fp8 = peak("fp8");
  return d;
}

Hardware parse_machine(const Json& row, const std::vector<DeviceSpec>& devices) {
  Hardware h;
  h.name = field<std::string>(row, "name", "a machine");
  const std::string where = "machine '" + h.name + "'";
  h.description = field<std::string>(row, "description", where);
  h.instance = field<std::string>(row, "instance", where);
  h.device = field<std::string>(row, "device", where);
  h.devices_per_node = field<int>(row, "devices_per_node", where);
  h.efa = field<int>(row, "efa", where);
  h.device_memory = field<double>(row, "device_memory_gb", where) * kGB;
  h.host_memory = field<double>(row, "host_memory_gb", where) * kGB;
  h.intra_node_bw = field<double>(row, "intra_node_gb_s", where) * kGB;
  h.network_bw = field<double>(row, "network_gb_s", where) * kGB;
  h.host_link_bw = field<double>(row, "host_link_gb_s", where) * kGB;
  h.intra_latency = field<double>(row, "intra_latency_us", where) / 1e6;
  h.network_latency = field<double>(row, "network_latency_us", where) / 1e6;
  h.efficiency = field<double>(row, "efficiency", where);
  const DeviceSpec* spec = nullptr;
  for (const DeviceSpec& d : devices) {
    if (d.name == h.device) spec = &d;
  }
  TORUS_CHECK(spec != nullptr, Error, "hardware table: {} names an unknown device '{}'", where, h.device);
  h.peak_flops_16 = spec->peak_flops_fp16;
  h.peak_flops_32 = spec->peak_flops_32;
  h.peak_flops_8 = spec->peak_flops_fp8;
  return h;
}

const Table& table() {
  static const Table t = [] {
    Json j;
    try {
      j = Json::parse(kHardwareTableJson);
    } catch (const Json::exception& e) {
      throw Error(fmt::format("hardware table: {}", e.what()));
    }
    TORUS_CHECK(j.value("format", "") == "torus-hardware-1", Error,
                "hardware table: format '{}' is not torus-hardware-1", j.value("format", ""));
    Table out;
    for (const Json& row : field<Json>(j, "devices", "the table")) out.devices.push_back(parse_device(row));
    for (const Json& row : field<Json>(j, "machines", "the table")) {
      out.machines.push_back(parse_machine(row, out.devices));
    }
    return out;
  }();
  return t;
}

}  // namespace

const std::vector<DeviceSpec>& device_specs() {
  return table().devices;
}

const DeviceSpec* match_device(const std::string& device_name) {
  for (const DeviceSpec& d : device_specs()) {
    for (const std::string& m : d.match) {
      if (!m.empty() && device_name.find(m) != std::string::npos) return &d;
    }
  }
  return nullptr;
}

const std::vector<Hardware>& hardware_presets() {
  return table().machines;
}

const Hardware* find_hardware(const std::string& name) {
  for (const Hardware& h : hardware_presets()) {
    if (h.name == name) return &h;
  }
  return nullptr;
}

std::string hardware_names() {
  std::string out;
  for (const Hardware& h : hardware_presets()) out += (out.empty() ? "" : ", ") + h.name;
  return out;
}

const char* hardware_table_json() {
  return kHardwareTableJson;
}

}  // namespace torus::device
