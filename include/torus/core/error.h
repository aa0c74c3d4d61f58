// torus/core/error.h — the error model of Torus.
//
// Every failure inside the library is reported by throwing one of these
// types; nothing calls exit() or prints. The Python bindings map each type to
// a Python exception of the same name (see python/torus/__init__.py):
//
//   Error            base of all Torus errors           -> torus.Error (RuntimeError)
//   InvalidArgument  bad input found before any comm    -> torus.InvalidArgument (ValueError)
//   CommError        a transport or peer failed         -> torus.CommError
//   TimeoutError     an operation passed its deadline   -> torus.TimeoutError (builtins.TimeoutError)
//   Unsupported      a valid request this build/backend
//                    cannot serve (see supports())      -> torus.Unsupported (NotImplementedError)
//
// Errors raised for a collective name the rank, the group, the op, the
// sequence number and the sizes, so that a log line alone locates the fault.
#pragma once

#include <stdexcept>
#include <string>

namespace torus {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

class InvalidArgument : public Error {
 public:
  using Error::Error;
};

class CommError : public Error {
 public:
  using Error::Error;
};

class TimeoutError : public Error {
 public:
  using Error::Error;
};

class Unsupported : public Error {
 public:
  using Error::Error;
};

}  // namespace torus
