#include "core/buffer_pool.h"

#include <utility>

namespace tessera {

std::vector<float> FloatBufferPool::Take(size_t n) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = idle_.find(n);
    if (it != idle_.end() && !it->second.empty()) {
      std::vector<float> buffer = std::move(it->second.back());
      it->second.pop_back();
      idle_bytes_ -= n * sizeof(float);
      return buffer;
    }
  }
  return std::vector<float>(n);
}

void FloatBufferPool::Give(std::vector<float>&& buffer) {
  const size_t n = buffer.size();
  if (n == 0 || buffer.capacity() != n) return;  // only exact buffers come back out of Take
  std::vector<float> kept = std::move(buffer);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (idle_bytes_ + n * sizeof(float) <= max_bytes_) {
      idle_bytes_ += n * sizeof(float);
      idle_[n].push_back(std::move(kept));
      return;
    }
  }
  // Over the bound: `kept` is freed here, outside the lock.
}

void FloatBufferPool::Give(TensorSet&& tensors) {
  for (NamedTensor& t : tensors) Give(std::move(t.values));
  tensors.clear();
}

void FloatBufferPool::Clear() {
  std::unordered_map<size_t, std::vector<std::vector<float>>> idle;
  {
    std::lock_guard<std::mutex> lock(mu_);
    idle.swap(idle_);
    idle_bytes_ = 0;
  }
}

uint64_t FloatBufferPool::idle_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return idle_bytes_;
}

}  // namespace tessera
