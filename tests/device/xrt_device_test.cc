// The XRT backend's host-side control path on XRT's no-op shim (Debian's libxrt1 ships
// libxrt_noop.so): a generated xclbin is parsed and loaded, buffer objects are allocated,
// synced and bound to the GEMM kernel's arguments, the run is started and waited for; every
// other op falls back to the host and is accounted. The shim computes nothing, so GEMM's
// numbers are not checked here; on a card the generic suite checks them.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <vector>

#include "device/placement.h"
#include "device/xrt/factory.h"
#include "tessera/config.h"
#if TESSERA_HAVE_XRT
#include "device/xrt/xclbin_writer.h"
#endif

namespace tessera {
namespace {

#if TESSERA_HAVE_XRT

constexpr char kNoopShim[] = "/usr/lib/x86_64-linux-gnu/libxrt_noop.so.2";

class XrtNoopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kNoopShim)) GTEST_SKIP() << "XRT's no-op shim is not installed (" << kNoopShim << ")";
    // XRT loads $XILINX_XRT/lib/libxrt_noop.so.2 when XCL_EMULATION_MODE=noop.
    const std::filesystem::path root = std::filesystem::path(::testing::TempDir()) / "tessera_xrt_root";
    std::filesystem::create_directories(root / "lib");
    std::error_code ignored;
    std::filesystem::create_symlink(kNoopShim, root / "lib" / "libxrt_noop.so.2", ignored);
    setenv("XILINX_XRT", root.c_str(), 1);
    setenv("XCL_EMULATION_MODE", "noop", 1);
    xclbin_ = ::testing::TempDir() + "tessera_gemm.xclbin";
    ASSERT_TRUE(xrt_backend::WriteXclbin(xrt_backend::GemmKernelSpec(), xclbin_).ok());
  }
  std::string xclbin_;
};

TEST_F(XrtNoopTest, DrivesTheGemmKernelAndAccountsHostFallbacks) {
  auto device = CreateXrtDevice(XrtDeviceOptions{.xclbin_path = xclbin_});
  ASSERT_TRUE(device.ok()) << device.status().ToString();
  EXPECT_TRUE(XrtUsesNoopShim());
  EXPECT_NE((*device)->capabilities().name.find("(no-op shim)"), std::string::npos);
  EXPECT_EQ((*device)->capabilities().native_ops, std::set<Op>{Op::kGemm});

  const int m = 8, n = 4, k = 16;
  auto a = (*device)->Allocate(m * k * sizeof(float));
  auto b = (*device)->Allocate(k * n * sizeof(float));
  auto c = (*device)->Allocate(m * n * sizeof(float));
  ASSERT_TRUE(a.ok() && b.ok() && c.ok()) << a.status().ToString();
  // A view into the middle of a buffer, as a model's parameter views are.
  (*device)->Gemm(false, true, m / 2, n, k, 1.0f, a->f32() + k * 2, b->f32(), 0.0f, c->f32());
  ASSERT_TRUE((*device)->Synchronize().ok()) << (*device)->Synchronize().ToString();
  OpPlacement& placement = *(*device)->placement();
  EXPECT_EQ(placement.Native(Op::kGemm).calls, 1u);
  EXPECT_EQ(placement.Fallback(Op::kGemm).calls, 0u);

  std::vector<float> values = {-1.0f, 2.0f, -3.0f, 4.0f};
  ASSERT_TRUE((*device)->CopyHostToDevice(values.data(), *c, 0, values.size() * sizeof(float)).ok());
  (*device)->Relu(4, c->f32(), c->f32());
  std::vector<float> got(4);
  ASSERT_TRUE((*device)->CopyDeviceToHost(*c, 0, got.data(), got.size() * sizeof(float)).ok());
  EXPECT_EQ(got, (std::vector<float>{0.0f, 2.0f, 0.0f, 4.0f}));
  EXPECT_EQ(placement.Fallback(Op::kRelu).calls, 1u);
  EXPECT_EQ(placement.Fallback(Op::kRelu).bytes_to_host, 16u);
  EXPECT_EQ(placement.Fallback(Op::kRelu).bytes_to_device, 16u);
}

TEST_F(XrtNoopTest, AMissingXclbinOrKernelIsNamed) {
  auto missing = CreateXrtDevice(XrtDeviceOptions{.xclbin_path = ::testing::TempDir() + "absent.xclbin"});
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("absent.xclbin"), std::string::npos) << missing.status().ToString();

  const std::string other = ::testing::TempDir() + "other_kernel.xclbin";
  ASSERT_TRUE(xrt_backend::WriteXclbin(xrt_backend::GemmKernelSpec("vadd"), other).ok());
  auto wrong = CreateXrtDevice(XrtDeviceOptions{.xclbin_path = other});
  EXPECT_EQ(wrong.status().code(), StatusCode::kNotFound);
  for (const char* part : {"other_kernel.xclbin", "tessera_gemm", "vadd"}) {
    EXPECT_NE(wrong.status().message().find(part), std::string::npos) << wrong.status().ToString();
  }
}

#endif  // TESSERA_HAVE_XRT

TEST(XrtViabilityTest, SaysWhyWithoutAnXclbin) {
  unsetenv("TESSERA_XRT_XCLBIN");
  Viability viability = XrtViability();
  EXPECT_FALSE(viability.viable);
  EXPECT_FALSE(viability.reason.empty());
}

}  // namespace
}  // namespace tessera
