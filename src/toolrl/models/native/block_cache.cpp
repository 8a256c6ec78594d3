// PyTorch's CPU allocator with freed large blocks kept mapped for the next allocation of the same size
// (models/native/block_cache.py says why and when).
//
// Blocks of at least `threshold` bytes are mapped with mmap, page-rounded. A freed one is kept, keyed by its
// size, for the next allocation of that size. The oldest kept blocks are unmapped (`evicted`) where they hold
// more than `capacity` bytes, and before a new block is mapped where the blocks in use and kept would exceed the
// most that were in use at once since the cache was last installed (`high`): what is mapped never exceeds what
// PyTorch's own allocator would have mapped at its peak. Each allocation or free of a large block is one tick; a
// kept block that no allocation of its size took within `max_age` ticks is unmapped (`expired`): sizes that
// stopped recurring (another sequence length, another phase) leave on their own.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>

namespace {

constexpr size_t kPage = 4096;

struct Stats {
  uint64_t hits = 0, misses = 0, evicted = 0, expired = 0, cached_bytes = 0;
};

std::mutex mutex;
std::unordered_map<void*, size_t> live;  // a large block in use -> its mapped size
std::unordered_map<size_t, std::deque<std::pair<uint64_t, void*>>> kept;  // size -> (tick freed, block), oldest first
std::map<uint64_t, size_t> by_age;  // tick freed -> size, over every kept block
size_t threshold = 1 << 20, capacity = 0, in_use = 0, high = 0;  // in use: mapped, not kept; high: its most
uint64_t tick = 0, max_age = 0;
bool caching = false;
Stats stats;

void drop_oldest() {  // with mutex held, by_age not empty
  size_t size = by_age.begin()->second;
  auto& blocks = kept[size];
  munmap(blocks.front().second, size);
  blocks.pop_front();
  if (blocks.empty()) kept.erase(size);
  stats.cached_bytes -= size;
  by_age.erase(by_age.begin());
}

void expire(uint64_t oldest) {  // with mutex held: unmap kept blocks freed before tick `oldest`
  while (!by_age.empty() && by_age.begin()->first < oldest) {
    drop_oldest();
    stats.expired++;
  }
}

void release(void* ptr) {
  {
    std::lock_guard<std::mutex> guard(mutex);
    auto it = live.find(ptr);
    if (it != live.end()) {
      size_t size = it->second;
      live.erase(it);
      in_use -= size;
      ++tick;
      if (!caching || size > capacity) {
        munmap(ptr, size);
        return;
      }
      kept[size].emplace_back(tick, ptr);
      by_age.emplace(tick, size);
      stats.cached_bytes += size;
      while (stats.cached_bytes > capacity) {
        drop_oldest();
        stats.evicted++;
      }
      return;
    }
  }
  c10::free_cpu(ptr);
}

void* take(size_t size) {  // with mutex held: a kept block of `size`, else nullptr
  ++tick;
  if (tick > max_age) expire(tick - max_age);
  auto it = kept.find(size);
  if (it == kept.end()) {
    stats.misses++;
    return nullptr;
  }
  void* ptr = it->second.back().second;  // the most recently freed: the likeliest still in the CPU's caches
  by_age.erase(it->second.back().first);
  it->second.pop_back();
  if (it->second.empty()) kept.erase(it);
  stats.cached_bytes -= size;
  stats.hits++;
  return ptr;
}

struct BlockCache final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    c10::Device cpu(c10::DeviceType::CPU);
    if (n < threshold) {
      void* ptr = c10::alloc_cpu(n);
      return {ptr, ptr, &release, cpu};
    }
    size_t size = (n + kPage - 1) & ~(kPage - 1);
    std::lock_guard<std::mutex> guard(mutex);
    void* ptr = take(size);
    if (ptr == nullptr) {
      size_t limit = std::max(high, in_use + size);  // kept blocks never take what is mapped past the peak in use
      while (stats.cached_bytes > 0 && in_use + size + stats.cached_bytes > limit) {
        drop_oldest();
        stats.evicted++;
      }
      ptr = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      TORCH_CHECK_WITH(OutOfMemoryError, ptr != MAP_FAILED, "CPU out of memory: cannot map ", size, " bytes");
    }
    live.emplace(ptr, size);
    in_use += size;
    if (in_use > high) high = in_use;
    return {ptr, ptr, &release, cpu};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

BlockCache instance;
c10::Allocator* previous = nullptr;

void flush_locked() {
  for (auto& entry : kept)
    for (auto& block : entry.second) munmap(block.second, entry.first);
  kept.clear();
  by_age.clear();
  stats.cached_bytes = 0;
}

}  // namespace

extern "C" {

// Make this PyTorch's CPU allocator (again, with these limits); 1 where it now is.
int toolrl_block_cache_install(uint64_t min_bytes, uint64_t max_cached, uint64_t age) {
  {
    std::lock_guard<std::mutex> guard(mutex);
    threshold = min_bytes < kPage ? kPage : min_bytes;
    capacity = max_cached;
    max_age = age;
    caching = true;
    high = in_use;
  }
  c10::Allocator* current = c10::GetCPUAllocator();
  if (current != &instance) {
    previous = current;
    c10::SetCPUAllocator(&instance, 0);
  }
  return c10::GetCPUAllocator() == &instance;
}

// Give PyTorch its previous allocator back and unmap every kept block; blocks still in use are unmapped when
// freed. 1 where the previous allocator is back.
int toolrl_block_cache_uninstall() {
  {
    std::lock_guard<std::mutex> guard(mutex);
    caching = false;
    flush_locked();
  }
  if (previous == nullptr) return 0;
  c10::SetCPUAllocator(previous, 0);
  return c10::GetCPUAllocator() == previous;
}

// Unmap every kept block (a phase ended: its sizes may not come back).
void toolrl_block_cache_flush() {
  std::lock_guard<std::mutex> guard(mutex);
  flush_locked();
}

// hits, misses, evicted, expired, mapped bytes (in use and kept), kept bytes, the most bytes in use at once.
void toolrl_block_cache_stats(uint64_t* out) {
  std::lock_guard<std::mutex> guard(mutex);
  out[0] = stats.hits;
  out[1] = stats.misses;
  out[2] = stats.evicted;
  out[3] = stats.expired;
  out[4] = in_use + stats.cached_bytes;
  out[5] = stats.cached_bytes;
  out[6] = high;
}

int toolrl_block_cache_installed() { return c10::GetCPUAllocator() == &instance; }
}
