// device_tests' main. XRT 2.13 stops its command scheduler from a static destructor whose
// order against its other statics is undefined; now and then that join never returns and
// the process hangs after every test has passed. Once the results are written this main
// leaves without running static destructors.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int result = RUN_ALL_TESTS();
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(result);
}
