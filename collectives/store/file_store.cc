#include "collectives/store/file_store.h"
#include "base/regular_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include "base/escape.h"
#include "base/sha256.h"
#include "base/whole_file.h"

namespace tessera::collectives {
namespace {

// Keys and the directory come from a job or a command line: every error shows them escaped
// and bounded, in quotes.
std::string Shown(const std::string& text) { return QuoteUntrusted(text, 256); }

// A key's file name: the key with every byte but letters, digits, '.', '_' and '-' written
// %XX, and a leading '.' too, so that no key's file is ".", "..", the lock file ".lock" or any
// other dot file, and none holds the '~' every temporary's name does. A key whose name would be
// empty or longer than kMaxPlainNameBytes (a file name is at most 255 bytes, and its temporaries
// add their suffix) is named by the first bytes of that name, "%#" and the key's SHA-256:
// "%#" is in no other name ('%' is otherwise followed by two hex digits), so the two kinds
// never meet, and two long keys share a file only if their hashes are equal.
constexpr size_t kMaxPlainNameBytes = 200;
constexpr size_t kHashedPrefixBytes = 128;

std::string KeyFileName(const std::string& key) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : key) {
    if (std::isalnum(c) || c == '_' || c == '-' || (c == '.' && !out.empty())) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  if (!out.empty() && out.size() <= kMaxPlainNameBytes) return out;
  size_t cut = std::min(out.size(), kHashedPrefixBytes);
  // Not inside a %XX escape, so that the name shows whole bytes of the key.
  if (cut >= 1 && out[cut - 1] == '%') cut -= 1;
  else if (cut >= 2 && out[cut - 2] == '%') cut -= 2;
  return out.substr(0, cut) + "%#" + Sha256Hex(key.data(), key.size());
}

// A temporary's name beside the key's file: unique among every writer of the directory, so
// that writers of the same key at once never write through, remove or rename each other's.
// It holds this process's id and 64 random bits drawn for this write: ranks on two machines
// sharing the directory over a mount, or in two containers, may have the same process id, and
// bits drawn once per process would be shared by the processes forked from it. A writer killed
// half-way leaves its temporary behind, harmless: its suffix starts with '~', which no key's
// file name holds (KeyFileName), so no temporary is ever another key's file and no Get ever
// reads one. At most 38 bytes, which KeyFileName leaves room for.
std::string TemporarySuffix() {
  static std::atomic<uint64_t> counter{0};
  uint64_t drawn = 0;
  if (::getrandom(&drawn, sizeof drawn, 0) != static_cast<ssize_t>(sizeof drawn)) {
    drawn = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
            (counter.fetch_add(1) << 48);
  }
  char suffix[48];
  std::snprintf(suffix, sizeof suffix, "~%ld.%016llx", static_cast<long>(::getpid()),
                static_cast<unsigned long long>(drawn));
  return suffix;
}

// Writes `value` whole as `key`'s file `path` (base/whole_file.h): every write and the close
// checked, the temporary removed on any failure, so a full disk never renames a cut value into
// place for a peer to read as a whole one. Not synced: a value matters only while the ranks
// that set it live, a power cut ends them all, and a store's directory is fresh for each job;
// close(2) is what makes the bytes visible to the other machines of a shared mount, and it is
// checked. UNAVAILABLE, as every failure of the store to reach its files, naming the key, the
// step and the file.
Status WriteValue(const std::string& key, const std::string& path, const std::string& value) {
  WholeFileOptions options;
  options.mode = 0666;  // narrowed by the umask, as any file a rank creates
  options.apply_umask = true;
  options.sync = false;
  options.suffix = TemporarySuffix();
  Status written = WriteFileWhole(path, value, options);
  if (written.ok()) return written;
  return UnavailableError("store key " + Shown(key) + ": " + written.message());
}

}  // namespace

Result<std::shared_ptr<FileStore>> FileStore::Open(const std::string& directory,
                                                   std::chrono::milliseconds lock_timeout) {
  if (lock_timeout.count() <= 0) {
    return InvalidArgumentError("file store " + Shown(directory) +
                                ": the lock timeout must be > 0 ms, got " +
                                std::to_string(lock_timeout.count()));
  }
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  if (error) {
    return UnavailableError("cannot create store directory " + Shown(directory) + ": " +
                            error.message());
  }
  return std::shared_ptr<FileStore>(new FileStore(directory, lock_timeout));
}

std::string FileStore::PathFor(const std::string& key) const {
  return directory_ + "/" + KeyFileName(key);
}

Result<std::string> FileStore::TryRead(const std::string& path) const {
  // Anyone who can write the directory decides what a key's file is. Opened without blocking
  // (a FIFO would block open(2) until a writer came, past every timeout), never through a
  // symbolic link (one planted there would make the key's value any file this rank can read;
  // a Set renames a regular file into place, never a link), and read only when it is a
  // regular file of at most kMaxValueBytes.
  const RegularFileOpen opened = OpenRegularFile(path, FinalSymlink::kRefuse);
  if (opened.open_errno != 0) {
    if (opened.open_errno == ENOENT) return NotFoundError(path);
    struct stat link {};
    if (opened.open_errno == ELOOP && ::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode)) {
      return FailedPreconditionError("store file " + Shown(path) +
                                     " is a symbolic link, which is not followed (a store's files are regular "
                                     "files, written by Set)");
    }
    return UnavailableError("cannot open store file " + Shown(path) + ": " + std::strerror(opened.open_errno));
  }
  if (opened.stat_errno != 0) {
    return UnavailableError("cannot stat store file " + Shown(path) + ": " + std::strerror(opened.stat_errno));
  }
  if (opened.not_regular) {
    return FailedPreconditionError("store file " + Shown(path) + " is not a regular file");
  }
  struct File {
    int fd;
    ~File() {
      if (fd >= 0) ::close(fd);
    }
  } file{opened.fd};
  const struct stat& info = opened.info;
  if (info.st_size > static_cast<off_t>(kMaxValueBytes)) {
    return FailedPreconditionError("store file " + Shown(path) + " is " + std::to_string(info.st_size) +
                                   " bytes, over the limit of " + std::to_string(kMaxValueBytes));
  }
  // Read to the end, one byte past the size fstat gave: a writer replaces a key's file whole
  // (rename), never writes it in place, so a file that reads shorter or longer than its size
  // (written in place meanwhile, or a file of a kind whose size says nothing, such as sysfs's)
  // holds no value this store wrote, and a part of it is never taken for one.
  const size_t expected = static_cast<size_t>(info.st_size);
  std::string content(expected + 1, '\0');
  size_t have = 0;
  while (have < content.size()) {
    const ssize_t n = ::read(file.fd, content.data() + have, content.size() - have);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return UnavailableError("cannot read store file " + Shown(path) + " after " + std::to_string(have) +
                              " of its " + std::to_string(expected) + " bytes: " + std::strerror(errno));
    }
    if (n == 0) break;
    have += static_cast<size_t>(n);
  }
  if (have != expected) {
    return FailedPreconditionError("store file " + Shown(path) + " changed while it was read: its size was " +
                                   std::to_string(expected) + " bytes, " +
                                   (have > expected ? "more" : std::to_string(have)) +
                                   " were read (a store's files are replaced whole, never written in place)");
  }
  content.resize(have);
  return content;
}

Status FileStore::Set(const std::string& key, const std::string& value) {
  return WriteValue(key, PathFor(key), value);
}

Result<std::string> FileStore::Get(const std::string& key, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const std::string path = PathFor(key);
  auto backoff = std::chrono::milliseconds(1);
  for (;;) {
    auto value = TryRead(path);
    if (value.ok()) return value;
    if (value.status().code() != StatusCode::kNotFound) {
      return value.status().WithContext("store key " + Shown(key));
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return DeadlineExceededError("store key " + Shown(key) + " not set within " +
                                   std::to_string(timeout.count()) + " ms (file store " +
                                   Shown(directory_) + ")");
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(20));
  }
}

Result<int64_t> FileStore::Add(const std::string& key, int64_t delta) {
  const std::string lock_path = directory_ + "/.lock";
  // Closing the descriptor releases the lock, on every return below.
  struct LockFile {
    int fd;
    ~LockFile() {
      if (fd >= 0) ::close(fd);
    }
  } lock{::open(lock_path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0644)};
  // Never through a symbolic link (one planted there would have this rank create or lock a file
  // of its choosing).
  if (lock.fd < 0 && errno == ELOOP) {
    return FailedPreconditionError("store key " + Shown(key) + ": the lock file " + Shown(lock_path) +
                                   " is a symbolic link, which is not followed; remove it");
  }
  if (lock.fd < 0) return UnavailableError("cannot open " + Shown(lock_path) + ": " + std::strerror(errno));
  // Never a blocking flock: a holder that is stopped or hung would hang this rank with it.
  const auto deadline = std::chrono::steady_clock::now() + lock_timeout_;
  auto backoff = std::chrono::milliseconds(1);
  while (::flock(lock.fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    if (errno != EWOULDBLOCK) {
      return UnavailableError("cannot lock " + Shown(lock_path) + ": " + std::strerror(errno));
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return DeadlineExceededError("store key " + Shown(key) + ": cannot lock " + Shown(lock_path) +
                                   " within " + std::to_string(lock_timeout_.count()) +
                                   " ms: another process or handle holds it (stopped or hung?)");
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(20));
  }
  int64_t value = 0;
  auto current = TryRead(PathFor(key));
  if (!current.ok() && current.status().code() != StatusCode::kNotFound) {
    return current.status().WithContext("store key " + Shown(key));
  }
  if (current.ok() && !current->empty()) {
    ASSIGN_OR_RETURN(value, ParseCounter(*current, "store key " + Shown(key) + " (" + Shown(PathFor(key)) + ")"));
  }
  ASSIGN_OR_RETURN(value, AddToCounter(value, delta, key));
  RETURN_IF_ERROR(WriteValue(key, PathFor(key), std::to_string(value)));
  return value;
}

}  // namespace tessera::collectives
