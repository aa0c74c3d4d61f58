// Private: Torus's own declarations of the part of the Neuron runtime C API
// (libnrt.so.1) that Torus calls, and the loaded library.
//
// No SDK header is included or vendored: the types below are declared from
// the runtime's documented API (nrt/nrt.h, nrt/nrt_version.h,
// nrt/nrt_status.h of runtime 2.x), only as far as Torus uses them. Opaque
// runtime objects stay opaque (pointers to incomplete structs); the one
// struct whose layout Torus reads (nrt_version_t) is declared with the
// documented field order and passed with its size, which the runtime checks.
// docs/neuron.md lists every call and the runtime versions targeted;
// tests/neuron/contract.sh exercises exactly these calls against a real
// runtime.
//
// Note [One runtime per process]: the library is opened once (NrtLibrary::get),
// nrt_init is called once, and nrt_close runs at process exit after every
// Torus object holding runtime memory has released it (the caching allocator
// is torn down first; see neuron_memory.h). A missing library or a failed
// init is remembered, not thrown: the device count is then 0, and anything
// that needs a NeuronCore throws Error with the reason.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace torus::device::neuron {

// --- the runtime's types (C ABI) ------------------------------------------------

extern "C" {
struct nrt_tensor;        // opaque: nrt_tensor_t
struct nrt_tensor_set;    // opaque: nrt_tensor_set_t
struct nrt_model;         // opaque: nrt_model_t

using NRT_STATUS = int;   // an enum in the SDK; int-sized
constexpr NRT_STATUS NRT_SUCCESS = 0;
constexpr NRT_STATUS NRT_FAILURE = 1;
constexpr NRT_STATUS NRT_INVALID = 2;
constexpr NRT_STATUS NRT_INVALID_HANDLE = 3;
constexpr NRT_STATUS NRT_RESOURCE = 4;
constexpr NRT_STATUS NRT_TIMEOUT = 5;
constexpr NRT_STATUS NRT_HW_ERROR = 6;
constexpr NRT_STATUS NRT_UNINITIALIZED = 13;
constexpr NRT_STATUS NRT_CLOSED = 14;

// nrt_framework_type_t
constexpr int NRT_FRAMEWORK_TYPE_NO_FW = 1;

// nrt_tensor_placement_t
constexpr int NRT_TENSOR_PLACEMENT_DEVICE = 0;
constexpr int NRT_TENSOR_PLACEMENT_HOST = 1;

// nrt_tensor_usage_t
constexpr int NRT_TENSOR_USAGE_INPUT = 0;
constexpr int NRT_TENSOR_USAGE_OUTPUT = 1;

constexpr size_t NRT_TENSOR_NAME_MAX = 256;

struct nrt_version_t {
  uint64_t rt_major;
  uint64_t rt_minor;
  uint64_t rt_patch;
  uint64_t rt_maintenance;
  char rt_detail[128];
  char git_hash[64];
};

struct nrt_tensor_info_t {
  char name[NRT_TENSOR_NAME_MAX];
  int usage;       // nrt_tensor_usage_t
  size_t size;     // bytes
  int dtype;       // nrt_dtype_t
  uint32_t* shape;
  uint32_t ndim;
};

struct nrt_tensor_info_array_t {
  uint64_t tensor_count;
  nrt_tensor_info_t tensor_array[1];  // tensor_count entries (flexible in C)
};

// --- host-driven ("out-of-NEFF") collectives, runtime 2.31+ (async API 3.0) ---
struct nrt_cc_context;  // opaque: nrt_cc_context_t
using nrta_seq_t = uint64_t;

// nrt_dtype_t (the hardware encoding of runtime 2.30+)
constexpr int NRT_DTYPE_UINT64 = 0x1;
constexpr int NRT_DTYPE_INT8 = 0x2;
constexpr int NRT_DTYPE_UINT8 = 0x3;
constexpr int NRT_DTYPE_BFLOAT16 = 0x6;
constexpr int NRT_DTYPE_FLOAT16 = 0x7;
constexpr int NRT_DTYPE_INT32 = 0x8;
constexpr int NRT_DTYPE_FLOAT32 = 0xA;
constexpr int NRT_DTYPE_INT64 = 0xC;

// nrt_op_type_t (reductions; the runtime has no product or average)
constexpr int NRT_OP_ADD = 0x0;
constexpr int NRT_OP_MAX = 0x2;
constexpr int NRT_OP_MIN = 0x3;

// nrt_cc_op_type_t
constexpr int NRT_CC_ALLGATHER = 0;
constexpr int NRT_CC_ALLREDUCE = 1;
constexpr int NRT_CC_REDUCESCATTER = 2;

// Filled by the caller for every op.
struct nrt_cc_comm_t {
  uint32_t* replica_group;  // the participants (global ids)
  uint32_t rank;            // this process's index in replica_group
  uint32_t rank_n;          // participants
  uint32_t ctx_device_id;   // this process's global id
  uint32_t ctx_device_count;
  uint32_t vnc;             // this process's logical NeuronCore
};

struct nrt_tensor_list_t {
  nrt_tensor** tensors;
  size_t num_tensors;
};
}  // extern "C"

// --- the loaded library ----------------------------------------------------------

// The runtime calls Torus uses, resolved from the library. The required ones
// must all be present or the library is refused; optional ones may be null.
struct NrtApi {
  // required
  NRT_STATUS (*nrt_init)(int framework, const char* fw_version, const char* fal_version);
  void (*nrt_close)();
  NRT_STATUS (*nrt_get_version)(nrt_version_t* version, size_t size);
  NRT_STATUS (*nrt_get_total_nc_count)(uint32_t* count);
  NRT_STATUS (*nrt_get_visible_nc_count)(uint32_t* count);
  NRT_STATUS (*nrt_tensor_allocate)(int placement, int logical_nc_id, size_t size, const char* name,
                                    nrt_tensor** tensor);
  void (*nrt_tensor_free)(nrt_tensor** tensor);
  NRT_STATUS (*nrt_tensor_read)(const nrt_tensor* tensor, void* buf, size_t offset, size_t size);
  NRT_STATUS (*nrt_tensor_write)(nrt_tensor* tensor, const void* buf, size_t offset, size_t size);
  NRT_STATUS (*nrt_tensor_copy)(const nrt_tensor* src, size_t src_offset, nrt_tensor* dst, size_t dst_offset,
                                size_t size);
  size_t (*nrt_tensor_get_size)(const nrt_tensor* tensor);
  // optional: memset (older runtimes lack it; Torus then writes a filled host buffer)
  NRT_STATUS (*nrt_tensor_memset)(nrt_tensor* tensor, uint64_t offset, int value, size_t size);
  // optional: a view of part of a tensor (binding a sub-range to a program)
  NRT_STATUS (*nrt_tensor_allocate_slice)(const nrt_tensor* source, size_t offset, size_t size, const char* name,
                                          nrt_tensor** slice);
  // optional: the runtime's device address of a tensor, for registering it
  // with a network adapter (Device::nic_address; null: not registrable)
  void* (*nrt_tensor_get_va)(const nrt_tensor* tensor);
  // optional: programs (NEFF); all or none (neff_program.h)
  NRT_STATUS (*nrt_load)(const void* neff, size_t size, int32_t start_nc, int32_t nc_count, nrt_model** model);
  NRT_STATUS (*nrt_unload)(nrt_model* model);
  NRT_STATUS (*nrt_execute)(nrt_model* model, const nrt_tensor_set* inputs, nrt_tensor_set* outputs);
  NRT_STATUS (*nrt_allocate_tensor_set)(nrt_tensor_set** set);
  void (*nrt_destroy_tensor_set)(nrt_tensor_set** set);
  NRT_STATUS (*nrt_add_tensor_to_tensor_set)(nrt_tensor_set* set, const char* name, nrt_tensor* tensor);
  NRT_STATUS (*nrt_get_model_tensor_info)(nrt_model* model, nrt_tensor_info_array_t** info);
  NRT_STATUS (*nrt_free_model_tensor_info)(nrt_tensor_info_array_t* info);

  // optional: host-driven collectives; all or none (src/comm/neuron)
  NRT_STATUS (*nrt_cc_global_comm_init)(uint32_t vnc, uint32_t global_id, uint32_t global_count);
  NRT_STATUS (*nrta_cc_prepare)(nrt_cc_comm_t* comm, nrt_tensor_list_t* inputs, nrt_tensor_list_t* outputs,
                                int dtype, int op, int cc_op, nrt_cc_context** ctx);
  NRT_STATUS (*nrta_cc_schedule)(nrt_cc_context** ctx, int queue, NRT_STATUS* result, nrta_seq_t* seq);
  NRT_STATUS (*nrta_is_completed)(nrta_seq_t seq, bool* completed);

  bool has_programs() const { return nrt_load != nullptr; }
  bool has_collectives() const { return nrt_cc_global_comm_init != nullptr; }
};

// Host-driven collectives with the 3.0 asynchronous API (status pointer in
// nrta_cc_schedule) need runtime 2.31 or later; older ones are refused.
constexpr uint64_t kMinCollectivesMinor = 31;

// The oldest runtime Torus accepts (the 2.x API above).
constexpr uint64_t kMinRuntimeMajor = 2;

// The process's runtime: opened, version checked and initialised on first
// use (Note [One runtime per process]).
class NrtLibrary {
 public:
  // The library, or nullptr when it is absent or unusable (never throws).
  static const NrtLibrary* get() noexcept;
  // The library; throws Error naming why it is unavailable.
  static const NrtLibrary& require(const char* what);
  // Why get() returned nullptr ("" when it did not).
  static std::string unavailable_reason();

  const NrtApi& api() const { return api_; }
  const std::string& path() const { return path_; }
  const nrt_version_t& version() const { return version_; }
  std::string version_string() const;
  int visible_cores() const { return visible_cores_; }
  int total_cores() const { return total_cores_; }

  ~NrtLibrary();
  NrtLibrary(const NrtLibrary&) = delete;
  NrtLibrary& operator=(const NrtLibrary&) = delete;

 private:
  NrtLibrary() = default;
  friend struct NrtLoader;

  void* handle_ = nullptr;
  std::string path_;
  NrtApi api_{};
  nrt_version_t version_{};
  int visible_cores_ = 0;
  int total_cores_ = 0;
  bool initialised_ = false;
};

// "NRT_RESOURCE (4)" for an NRT_STATUS.
std::string status_name(NRT_STATUS status);

// Throws Error "Neuron runtime: <call> failed: <status> at file:line".
[[noreturn]] void throw_nrt_error(NRT_STATUS status, const char* call, const char* file, int line);

}  // namespace torus::device::neuron

#define TORUS_CHECK_NRT(call_expr)                                                                 \
  do {                                                                                            \
    ::torus::device::neuron::NRT_STATUS torus_nrt_status_ = (call_expr);                          \
    if (torus_nrt_status_ != ::torus::device::neuron::NRT_SUCCESS)                                \
      ::torus::device::neuron::throw_nrt_error(torus_nrt_status_, #call_expr, __FILE__, __LINE__); \
  } while (0)
