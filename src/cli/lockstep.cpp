#include "cli/lockstep.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "util/error.h"

namespace reprise::cli {

Lockstep::Lockstep(const std::string& in_fifo, const std::string& out_fifo) {
  // O_RDWR: opening a FIFO read-write never waits for the other end, and a
  // partner that exits leaves no SIGPIPE or EOF behind (the timeout notices).
  in_ = ::open(in_fifo.c_str(), O_RDWR | O_CLOEXEC);
  if (in_ < 0) throw Error("lockstep: cannot open '" + in_fifo + "': " + std::strerror(errno));
  out_ = ::open(out_fifo.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (out_ < 0) {
    const std::string why = std::strerror(errno);
    ::close(in_);
    in_ = -1;
    throw Error("lockstep: cannot open '" + out_fifo + "': " + why);
  }
}

Lockstep::~Lockstep() {
  if (in_ >= 0) ::close(in_);
  if (out_ >= 0) ::close(out_);
}

void Lockstep::stop(const char* why) {
  std::fprintf(stderr, "lockstep: %s; going on alone\n", why);
  ::close(in_);
  ::close(out_);
  in_ = out_ = -1;
}

void Lockstep::wait_turn(int timeout_ms) {
  if (!active()) return;
  pollfd p{in_, POLLIN, 0};
  int ready;
  do ready = ::poll(&p, 1, timeout_ms);
  while (ready < 0 && errno == EINTR);
  if (ready <= 0) return stop("the partner passed no turn in time");
  char byte;
  ssize_t n;
  do n = ::read(in_, &byte, 1);
  while (n < 0 && errno == EINTR);
  if (n != 1) stop("reading the turn failed");
}

void Lockstep::pass_turn() {
  if (!active()) return;
  const char byte = 1;
  ssize_t n;
  do n = ::write(out_, &byte, 1);
  while (n < 0 && errno == EINTR);
  if (n != 1) stop("passing the turn failed");
}

}  // namespace reprise::cli
