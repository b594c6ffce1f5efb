// The C layouts the host kernels share with XLA (pjrt_c_api.h, its FFI extension
// pjrt_c_api_ffi_extension.h, and the XLA FFI xla/ffi/api/c_api.h), and the two things
// every handler does with them: answer the metadata query and report an error.
// No PyTorch here (see cpu_kernels.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

namespace torchtpu_cpu {

struct ExtensionBase {  // PJRT_Extension_Base and XLA_FFI_Extension_Base alike
  size_t struct_size;
  int type;
  ExtensionBase* next;
};

constexpr int kPjrtExtensionTypeFfi = 5;  // PJRT_Extension_Type_FFI
constexpr int kFfiExtensionMetadata = 1;  // XLA_FFI_Extension_Metadata

struct PjrtApiPrefix {  // PJRT_Api starts with these two fields
  size_t struct_size;
  ExtensionBase* extension_start;
};

struct RegisterHandlerArgs {  // PJRT_FFI_Register_Handler_Args
  size_t struct_size;
  const char* target_name;
  size_t target_name_size;
  void* handler;  // XLA_FFI_Handler*
  const char* platform_name;
  size_t platform_name_size;
  uint32_t traits;
};

struct PjrtFfiExtension {  // PJRT_FFI_Extension
  ExtensionBase base;
  void* type_id_register;
  void* user_data_add;
  void* (*register_handler)(RegisterHandlerArgs*);
};

struct FfiApiVersion {  // XLA_FFI_Api_Version
  size_t struct_size;
  ExtensionBase* extension_start;
  int major_version;
  int minor_version;
};

struct FfiErrorCreateArgs {  // XLA_FFI_Error_Create_Args
  size_t struct_size;
  ExtensionBase* extension_start;
  const char* message;
  int errc;
};

struct FfiApi {  // XLA_FFI_Api, up to the first entry used here
  size_t struct_size;
  ExtensionBase* extension_start;
  FfiApiVersion api_version;
  void* internal_api;
  void* (*error_create)(FfiErrorCreateArgs*);
};

struct FfiMetadata {  // XLA_FFI_Metadata (newer versions append fields)
  size_t struct_size;
  FfiApiVersion api_version;
  uint32_t traits;
};

struct FfiMetadataExtension {  // XLA_FFI_Metadata_Extension
  ExtensionBase extension_base;
  FfiMetadata* metadata;
};

struct FfiBuffer {  // XLA_FFI_Buffer
  size_t struct_size;
  ExtensionBase* extension_start;
  int dtype;  // XLA_FFI_DataType
  void* data;
  int64_t rank;
  int64_t* dims;
};

struct FfiList {  // XLA_FFI_Args and XLA_FFI_Rets
  size_t struct_size;
  ExtensionBase* extension_start;
  int64_t size;
  int* types;
  void** items;
};

struct FfiCallFrame {  // XLA_FFI_CallFrame, up to the fields read here
  size_t struct_size;
  ExtensionBase* extension_start;
  const FfiApi* api;
  void* ctx;
  int stage;
  FfiList args;
  FfiList rets;
};

constexpr int kFfiS32 = 4, kFfiS64 = 5, kFfiBf16 = 16, kFfiF32 = 11, kFfiF64 = 12;  // XLA_FFI_DataType
constexpr int kFfiInvalidArgument = 3;                    // XLA_FFI_Error_Code

inline void* Fail(const FfiApi* api, const char* message) {
  FfiErrorCreateArgs args{sizeof(FfiErrorCreateArgs), nullptr, message, kFfiInvalidArgument};
  return api->error_create(&args);
}

// Registration asks which FFI version a handler speaks: the framework's own.
inline bool AnswerMetadata(FfiCallFrame* frame) {
  if (frame->extension_start == nullptr || frame->extension_start->type != kFfiExtensionMetadata) return false;
  auto* ext = reinterpret_cast<FfiMetadataExtension*>(frame->extension_start);
  ext->metadata->api_version.major_version = frame->api->api_version.major_version;
  ext->metadata->api_version.minor_version = frame->api->api_version.minor_version;
  ext->metadata->traits = 0;
  return true;
}

}  // namespace torchtpu_cpu
