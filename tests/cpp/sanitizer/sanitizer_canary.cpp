// A program with one deliberate bug per sanitizer, run only in sanitizer builds: its ctest entry
// passes when the sanitizer reports the bug and the process exits non-zero, which proves that
// the build is instrumented and that a report fails a test (not just prints).
//   sanitizer_canary asan | ubsan | tsan
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace {

int heapOverflow() {
  volatile int* p = new int[4];
  int v = p[4];  // one past the end
  delete[] p;
  return v;
}

int signedOverflow(int big) { return big + 1; }

int race() {
  int shared = 0;  // written by two threads without synchronization
  std::thread a([&] { shared = 1; });
  std::thread b([&] { shared = 2; });
  a.join();
  b.join();
  return shared;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  int v = 0;
  if (std::strcmp(argv[1], "asan") == 0) v = heapOverflow();
  if (std::strcmp(argv[1], "ubsan") == 0) v = signedOverflow(std::atoi("2147483647"));
  if (std::strcmp(argv[1], "tsan") == 0) v = race();
  std::printf("canary %s ran to the end (%d): no sanitizer stopped it\n", argv[1], v);
  return 0;
}
