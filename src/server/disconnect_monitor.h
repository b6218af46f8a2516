// Notices clients that hang up while their request is being worked on.
//
// A write to a closed socket fails only when there is something to write,
// which is too late during a long prefill or a non-streamed request. The
// monitor instead polls the sockets of in-flight requests for a peer
// shutdown (POLLRDHUP) from one thread and fires the request's callback (which
// cancels its generation) within one poll interval.
//
// cpp-httplib does not hand the socket to handlers, so find_connection_socket
// locates it from the connection's addresses (Linux: a sock_diag query gives
// the socket's inode, /proc/self/fd's links the descriptor holding it).
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

namespace reprise {

// The descriptor of this process's TCP socket with exactly these endpoints
// (numeric hosts as cpp-httplib formats them; an IPv4-mapped IPv6 address
// matches its IPv4 form). Reads /proc only: never calls into descriptors other
// threads may be closing.
std::optional<int> find_connection_socket(const std::string& local_addr, int local_port,
                                          const std::string& remote_addr, int remote_port);

// The two ways find_connection_socket finds a connection's socket inode (any
// process's, in this network namespace): one exact sock_diag netlink query,
// and, where that is unavailable, a scan of /proc/self/net/tcp{,6}.
std::optional<uint64_t> socket_inode_from_netlink(const std::string& local_addr, int local_port,
                                                  const std::string& remote_addr, int remote_port);
std::optional<uint64_t> socket_inode_from_proc(const std::string& local_addr, int local_port,
                                               const std::string& remote_addr, int remote_port);

class DisconnectMonitor {
 public:
  explicit DisconnectMonitor(std::chrono::milliseconds interval = std::chrono::milliseconds(50));
  ~DisconnectMonitor();
  DisconnectMonitor(const DisconnectMonitor&) = delete;
  DisconnectMonitor& operator=(const DisconnectMonitor&) = delete;

  // Stops watching when destroyed; after that the callback is never called.
  class Watch {
   public:
    Watch() = default;
    Watch(Watch&& other) noexcept : monitor_(std::exchange(other.monitor_, nullptr)), id_(other.id_) {}
    Watch& operator=(Watch&& other) noexcept;
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;
    ~Watch() { reset(); }
    void reset();

   private:
    friend class DisconnectMonitor;
    Watch(DisconnectMonitor* monitor, uint64_t id) : monitor_(monitor), id_(id) {}
    DisconnectMonitor* monitor_ = nullptr;
    uint64_t id_ = 0;
  };

  // Calls `on_hangup` once, from the monitor thread and under its lock (keep
  // it short: set a flag), when the peer of `fd` closes or resets. The socket
  // must stay open while the Watch lives.
  Watch watch(int fd, std::function<void()> on_hangup);

  size_t watched() const;

 private:
  void unwatch(uint64_t id);
  void loop();

  const std::chrono::milliseconds interval_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::map<uint64_t, std::pair<int, std::function<void()>>> watches_;
  uint64_t next_id_ = 1;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace reprise
