#include <cerrno>
#include <cstring>
#include <string>

#include "core/log.h"

namespace torus::detail {

std::string errno_string(int err) {
  char buf[256];
  // GNU strerror_r returns the message pointer (which may not be buf).
  const char* msg = ::strerror_r(err, buf, sizeof(buf));
  return std::string(msg) + " [errno " + std::to_string(err) + "]";
}

}  // namespace torus::detail
