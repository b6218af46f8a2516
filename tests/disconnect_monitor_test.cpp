// DisconnectMonitor and find_connection_socket on real loopback connections.
#include "server/disconnect_monitor.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <utility>

namespace reprise {
namespace {

using namespace std::chrono_literals;

// A socket descriptor closed on scope exit.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  int get() const { return fd_; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

struct Endpoint {
  std::string host;
  int port = 0;
};

Endpoint endpoint(const sockaddr_storage& a) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(a);
    inet_ntop(AF_INET, &v4.sin_addr, buf, sizeof buf);
    return {buf, ntohs(v4.sin_port)};
  }
  const auto& v6 = reinterpret_cast<const sockaddr_in6&>(a);
  inet_ntop(AF_INET6, &v6.sin6_addr, buf, sizeof buf);
  return {buf, ntohs(v6.sin6_port)};
}

Endpoint local_of(int fd) {
  sockaddr_storage a{};
  socklen_t n = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
  return endpoint(a);
}

Endpoint peer_of(int fd) {
  sockaddr_storage a{};
  socklen_t n = sizeof a;
  getpeername(fd, reinterpret_cast<sockaddr*>(&a), &n);
  return endpoint(a);
}

// A connected pair over loopback: `server` is the accepted side.
struct Connection {
  Fd listener, client, server;
};

std::optional<Connection> connect_loopback(int family) {
  Connection c;
  c.listener = Fd(::socket(family, SOCK_STREAM, 0));
  if (c.listener.get() < 0) return std::nullopt;
  sockaddr_storage addr{};
  socklen_t len = 0;
  if (family == AF_INET) {
    auto& v4 = reinterpret_cast<sockaddr_in&>(addr);
    v4.sin_family = AF_INET;
    v4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    len = sizeof v4;
  } else {
    auto& v6 = reinterpret_cast<sockaddr_in6&>(addr);
    v6.sin6_family = AF_INET6;
    v6.sin6_addr = in6addr_loopback;
    len = sizeof v6;
  }
  if (::bind(c.listener.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) return std::nullopt;
  if (::listen(c.listener.get(), 4) != 0) return std::nullopt;
  socklen_t bound_len = sizeof addr;
  getsockname(c.listener.get(), reinterpret_cast<sockaddr*>(&addr), &bound_len);
  c.client = Fd(::socket(family, SOCK_STREAM, 0));
  if (::connect(c.client.get(), reinterpret_cast<sockaddr*>(&addr), bound_len) != 0) return std::nullopt;
  c.server = Fd(::accept(c.listener.get(), nullptr, nullptr));
  if (c.server.get() < 0) return std::nullopt;
  return c;
}

bool netlink_available() {
  const int fd = ::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

// Both inode lookups agree on the connection, and neither takes the
// listener (which has the same local endpoint) for a connection.
void expect_lookups_agree(const Endpoint& self, const Endpoint& peer) {
  const auto from_proc = socket_inode_from_proc(self.host, self.port, peer.host, peer.port);
  ASSERT_TRUE(from_proc.has_value());
  if (netlink_available()) {
    EXPECT_EQ(socket_inode_from_netlink(self.host, self.port, peer.host, peer.port), from_proc);
    EXPECT_EQ(socket_inode_from_netlink(self.host, self.port, peer.host, peer.port == 1 ? 2 : 1), std::nullopt);
  }
  EXPECT_EQ(socket_inode_from_proc(self.host, self.port, peer.host, peer.port == 1 ? 2 : 1), std::nullopt);
}

void expect_found(int family) {
  auto c = connect_loopback(family);
  if (!c) GTEST_SKIP() << "no loopback for address family " << family;
  const Endpoint self = local_of(c->server.get()), peer = peer_of(c->server.get());
  expect_lookups_agree(self, peer);
  EXPECT_EQ(find_connection_socket(self.host, self.port, peer.host, peer.port), c->server.get());
  // The client's socket has the same endpoints the other way round.
  EXPECT_EQ(find_connection_socket(peer.host, peer.port, self.host, self.port), c->client.get());
  // A port that is not this connection's finds nothing.
  EXPECT_EQ(find_connection_socket(self.host, self.port, peer.host, peer.port == 1 ? 2 : 1), std::nullopt);
  // Once closed, this process holds no socket with those endpoints.
  c->server.reset();
  EXPECT_EQ(find_connection_socket(self.host, self.port, peer.host, peer.port), std::nullopt);
}

TEST(FindConnectionSocket, FindsTheAcceptedSocketOverIPv4) { expect_found(AF_INET); }

TEST(FindConnectionSocket, FindsTheAcceptedSocketOverIPv6) { expect_found(AF_INET6); }

TEST(FindConnectionSocket, MatchesIPv4MappedAddresses) {
  auto c = connect_loopback(AF_INET);
  if (!c) GTEST_SKIP() << "no IPv4 loopback";
  const Endpoint self = local_of(c->server.get()), peer = peer_of(c->server.get());
  EXPECT_EQ(find_connection_socket("::ffff:" + self.host, self.port, "::ffff:" + peer.host, peer.port),
            c->server.get());
}

TEST(FindConnectionSocket, FindsAnIPv4ClientOfADualStackListener) {
  // An IPv6 listener that also takes IPv4: the connection is in the tcp6
  // table as ::ffff:127.0.0.1, and cpp-httplib may name it either way.
  Fd listener(::socket(AF_INET6, SOCK_STREAM, 0));
  ASSERT_GE(listener.get(), 0);
  int off = 0;
  setsockopt(listener.get(), IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
  sockaddr_in6 any{};
  any.sin6_family = AF_INET6;
  any.sin6_addr = in6addr_any;
  if (::bind(listener.get(), reinterpret_cast<sockaddr*>(&any), sizeof any) != 0 ||
      ::listen(listener.get(), 4) != 0)
    GTEST_SKIP() << "no dual-stack listener";
  sockaddr_in6 bound{};
  socklen_t bound_len = sizeof bound;
  getsockname(listener.get(), reinterpret_cast<sockaddr*>(&bound), &bound_len);
  Fd client(::socket(AF_INET, SOCK_STREAM, 0));
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  to.sin_port = bound.sin6_port;
  if (::connect(client.get(), reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) GTEST_SKIP() << "no IPv4 loopback";
  Fd server(::accept(listener.get(), nullptr, nullptr));
  ASSERT_GE(server.get(), 0);
  const Endpoint self = local_of(server.get()), peer = peer_of(server.get());
  ASSERT_EQ(self.host.rfind("::ffff:", 0), 0u) << self.host;
  expect_lookups_agree(self, peer);
  EXPECT_EQ(find_connection_socket(self.host, self.port, peer.host, peer.port), server.get());
  EXPECT_EQ(find_connection_socket(self.host.substr(7), self.port, peer.host.substr(7), peer.port), server.get());
}

TEST(DisconnectMonitor, FiresOnceWhenThePeerHangsUp) {
  auto c = connect_loopback(AF_INET);
  ASSERT_TRUE(c);
  DisconnectMonitor monitor(5ms);
  std::atomic<int> calls{0};
  auto watch = monitor.watch(c->server.get(), [&] { ++calls; });
  std::this_thread::sleep_for(30ms);
  EXPECT_EQ(calls.load(), 0) << "fired while the peer was connected";
  c->client.reset();
  const auto t0 = std::chrono::steady_clock::now();
  while (calls.load() == 0 && std::chrono::steady_clock::now() - t0 < 2s) std::this_thread::sleep_for(2ms);
  std::this_thread::sleep_for(30ms);
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(monitor.watched(), 0u);
}

TEST(DisconnectMonitor, NeverFiresAfterTheWatchEnds) {
  auto c = connect_loopback(AF_INET);
  ASSERT_TRUE(c);
  DisconnectMonitor monitor(5ms);
  std::atomic<int> calls{0};
  {
    auto watch = monitor.watch(c->server.get(), [&] { ++calls; });
    EXPECT_EQ(monitor.watched(), 1u);
  }
  EXPECT_EQ(monitor.watched(), 0u);
  c->client.reset();
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(calls.load(), 0);
}

}  // namespace
}  // namespace reprise
