// Private: the job token of a loopback job started without TORUS_JOB_TOKEN
// (Note [Local job token]).
//
// Note [Local job token]: when the store is on loopback, every rank is on
// rank 0's host and runs as one user, so the user's own file system can carry
// the secret that the network may not. Rank 0 generates a token, starts its
// server, then writes the token to
//   <runtime dir>/torus-<uid>/store-<numeric address>-<port>.token
// (runtime dir: TORUS_RUNTIME_DIR, else XDG_RUNTIME_DIR, else TMPDIR, else
// /tmp), a 0600 file in a 0700 directory, atomically (temporary file, fsync,
// rename, fsync of the directory). Every rank derives the same path from its
// own environment and the master address, so nothing is exchanged before the
// store. The other ranks wait for the file (within the store timeout), and a
// rank whose token is refused re-reads the file and tries again: the file may
// be a stale one left by an earlier job on the same port whose rank 0 died,
// and rank 0 replaces it once its server is up. Rank 0 removes the file when
// its store server shuts down.
//
// The directory is refused (InvalidArgument naming it and why) when it is a
// symbolic link or not a directory, is owned by another user, or is open to
// group or others: anyone who could read it could join the job, and anyone
// who could write it could hand the ranks a token of their own store. There is
// no fallback to a well-known token in that case: that fallback is what an
// attacker would provoke by creating the directory first.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "comm/store_protocol.h"
#include "torus/comm/store.h"

namespace torus::comm {

struct LocalTokenPath {
  std::string dir;   // <runtime dir>/torus-<uid>
  std::string name;  // store-<address>-<port>.token
  std::string file() const { return dir + "/" + name; }
};

// The path of the token of the job whose store is at numeric_addr:port.
// Characters of the address other than [A-Za-z0-9.] become '_' (IPv6 colons).
LocalTokenPath local_token_path(const std::string& runtime_dir, const std::string& numeric_addr, int port);

// Rank 0's side. The constructor creates the directory (0700) when it is
// missing and checks it; publish() writes the token file; the destructor
// removes the file if it still holds the published token. Throws
// InvalidArgument for an unsafe or unusable directory, CommError when the
// file cannot be written.
class LocalTokenFile {
 public:
  explicit LocalTokenFile(LocalTokenPath path);
  ~LocalTokenFile();
  LocalTokenFile(const LocalTokenFile&) = delete;
  LocalTokenFile& operator=(const LocalTokenFile&) = delete;

  void publish(const std::string& token);
  const LocalTokenPath& path() const { return path_; }

 private:
  LocalTokenPath path_;
  store_proto::Fd dir_;
  std::string published_;
};

// The other ranks' side: the token in the file, or nullopt while the
// directory or the file does not exist. Throws InvalidArgument when the
// directory or the file is unsafe (see the Note) or the file is malformed.
std::optional<std::string> read_local_token(const LocalTokenPath& path);

// Connects a client to the store with the token from `path` (options.token is
// ignored), waiting for the file and re-reading it after every refused
// handshake, until options.connect_timeout. Throws TimeoutError naming the
// file and the last failure, InvalidArgument for an unsafe directory.
std::shared_ptr<TcpStore> connect_with_local_token(TcpStore::Options options, const LocalTokenPath& path);

}  // namespace torus::comm
