#include "base/regular_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

namespace tessera {

RegularFileOpen OpenRegularFile(const std::string& path, FinalSymlink symlink) {
  RegularFileOpen opened;
  const int flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | (symlink == FinalSymlink::kRefuse ? O_NOFOLLOW : 0);
  const int fd = ::open(path.c_str(), flags);
  if (fd < 0) {
    opened.open_errno = errno;
    return opened;
  }
  if (::fstat(fd, &opened.info) != 0) {
    opened.stat_errno = errno;
  } else if (!S_ISREG(opened.info.st_mode)) {
    opened.not_regular = true;
  } else {
    opened.fd = fd;
    return opened;
  }
  ::close(fd);
  return opened;
}

}  // namespace tessera
