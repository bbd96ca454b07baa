#include "device/xrt/xclbin_writer.h"

#include <xrt/xclbin.h>

#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>

namespace tessera::xrt_backend {
namespace {

template <typename T>
std::vector<char> Bytes(const T& value) {
  std::vector<char> bytes(sizeof(T));
  std::memcpy(bytes.data(), &value, sizeof(T));
  return bytes;
}

std::string MetadataXml(const XclbinSpec& spec) {
  std::ostringstream xml;
  xml << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      << "<project name=\"tessera\"><platform vendor=\"tessera\" boardid=\"noop\" name=\"noop\" featureRomTime=\"0\">"
      << "<version major=\"1\" minor=\"0\"/><description/><board name=\"noop\" vendor=\"tessera\"/>"
      << "<device name=\"fpga0\" fpgaDevice=\"noop\" addrWidth=\"0\"><systemClocks/><core name=\"OCL_REGION_0\" "
         "target=\"bitstream\" type=\"clc_region\" clockFreq=\"0MHz\" numComputeUnits=\"1\">\n"
      << "<kernel name=\"" << spec.kernel_name << "\" language=\"c\" vlnv=\"tessera:kernel:" << spec.kernel_name
      << ":1.0\" attributes=\"\" preferredWorkGroupSizeMultiple=\"0\" workGroupSize=\"1\" interrupt=\"true\" "
         "hwControlProtocol=\"ap_ctrl_hs\">\n"
      << "<port name=\"M_AXI_GMEM\" mode=\"master\" range=\"0xFFFFFFFF\" dataWidth=\"32\" portType=\"addressable\" "
         "base=\"0x0\"/>\n"
      << "<port name=\"S_AXI_CONTROL\" mode=\"slave\" range=\"0x1000\" dataWidth=\"32\" portType=\"addressable\" "
         "base=\"0x0\"/>\n";
  uint32_t offset = 0x10;
  for (size_t id = 0; id < spec.arguments.size(); ++id) {
    const XclbinKernelArgument& argument = spec.arguments[id];
    const uint32_t size = argument.is_buffer ? 8 : 4;
    xml << "<arg name=\"" << argument.name << "\" addressQualifier=\"" << (argument.is_buffer ? 1 : 0)
        << "\" id=\"" << id << "\" port=\"" << (argument.is_buffer ? "M_AXI_GMEM" : "S_AXI_CONTROL")
        << "\" size=\"0x" << std::hex << size << "\" offset=\"0x" << offset << std::dec
        << "\" hostOffset=\"0x0\" hostSize=\"0x" << size << "\" type=\"" << argument.type << "\"/>\n";
    offset += argument.is_buffer ? 0xC : 0x8;
  }
  xml << "<instance name=\"" << spec.kernel_name << "_1\"><addrRemap base=\"0x1800000\" port=\"S_AXI_CONTROL\"/>"
      << "</instance>\n</kernel>\n</core></device></platform></project>\n";
  return xml.str();
}

}  // namespace

XclbinSpec GemmKernelSpec(const std::string& kernel_name) {
  XclbinSpec spec;
  spec.kernel_name = kernel_name;
  spec.arguments = {{"a", true, "float*"}, {"b", true, "float*"},  {"c", true, "float*"},
                    {"m", false, "int"},   {"n", false, "int"},    {"k", false, "int"},
                    {"flags", false, "int"}, {"alpha", false, "float"}, {"beta", false, "float"}};
  return spec;
}

std::vector<char> BuildXclbin(const XclbinSpec& spec) {
  // Sections, in the order their headers appear.
  std::vector<std::pair<axlf_section_kind, std::vector<char>>> sections;

  ip_layout layout{};
  layout.m_count = 1;
  layout.m_ip_data[0].m_type = IP_KERNEL;
  layout.m_ip_data[0].properties = (AP_CTRL_HS << IP_CONTROL_SHIFT) | 0x1;  // interrupt enabled
  layout.m_ip_data[0].m_base_address = 0x1800000;
  const std::string cu_name = spec.kernel_name + ":" + spec.kernel_name + "_1";
  std::strncpy(reinterpret_cast<char*>(layout.m_ip_data[0].m_name), cu_name.c_str(), 63);
  sections.push_back({IP_LAYOUT, Bytes(layout)});

  mem_topology topology{};
  topology.m_count = 1;
  topology.m_mem_data[0].m_type = MEM_DDR4;
  topology.m_mem_data[0].m_used = 1;
  topology.m_mem_data[0].m_size = spec.memory_bytes / 1024;
  topology.m_mem_data[0].m_base_address = 0x4000000000ull;
  std::strncpy(reinterpret_cast<char*>(topology.m_mem_data[0].m_tag), "DDR[0]", 15);
  sections.push_back({MEM_TOPOLOGY, Bytes(topology)});

  std::vector<connection> links;
  for (size_t id = 0; id < spec.arguments.size(); ++id) {
    if (spec.arguments[id].is_buffer) links.push_back(connection{static_cast<int32_t>(id), 0, 0});
  }
  std::vector<char> connectivity_bytes(sizeof(int32_t) + std::max<size_t>(1, links.size()) * sizeof(connection), 0);
  const int32_t link_count = static_cast<int32_t>(links.size());
  std::memcpy(connectivity_bytes.data(), &link_count, sizeof(link_count));
  if (!links.empty()) {
    std::memcpy(connectivity_bytes.data() + offsetof(connectivity, m_connection), links.data(),
                links.size() * sizeof(connection));
  }
  sections.push_back({CONNECTIVITY, connectivity_bytes});

  const std::string xml = MetadataXml(spec);
  sections.push_back({EMBEDDED_METADATA, std::vector<char>(xml.begin(), xml.end())});

  const size_t header_bytes = sizeof(axlf) + (sections.size() - 1) * sizeof(axlf_section_header);
  std::vector<char> file(header_bytes, 0);
  std::vector<axlf_section_header> headers;
  for (const auto& [kind, payload] : sections) {
    while (file.size() % 8 != 0) file.push_back(0);
    axlf_section_header header{};
    header.m_sectionKind = kind;
    std::strncpy(header.m_sectionName, "tessera", sizeof(header.m_sectionName) - 1);
    header.m_sectionOffset = file.size();
    header.m_sectionSize = payload.size();
    headers.push_back(header);
    file.insert(file.end(), payload.begin(), payload.end());
  }

  axlf top{};
  std::memcpy(top.m_magic, "xclbin2", 8);
  top.m_signature_length = -1;
  std::memset(top.reserved, 0xFF, sizeof(top.reserved));
  top.m_uniqueId = 0x7e55e7a;
  top.m_header.m_length = file.size();
  top.m_header.m_timeStamp = static_cast<uint64_t>(std::time(nullptr));
  top.m_header.m_versionMajor = 2;
  top.m_header.m_versionMinor = 13;
  top.m_header.m_mode = XCLBIN_FLAT;
  std::strncpy(reinterpret_cast<char*>(top.m_header.m_platformVBNV), "tessera:noop:gemm:1.0", 63);
  // A uuid derived from the kernel name, so two different specs never share one.
  for (size_t i = 0; i < spec.kernel_name.size(); ++i) top.m_header.uuid[i % 16] ^= spec.kernel_name[i];
  top.m_header.uuid[15] ^= 0x5A;
  top.m_header.m_numSections = static_cast<uint32_t>(sections.size());
  std::memcpy(file.data(), &top, offsetof(axlf, m_sections));
  std::memcpy(file.data() + offsetof(axlf, m_sections), headers.data(), headers.size() * sizeof(axlf_section_header));
  return file;
}

Status WriteXclbin(const XclbinSpec& spec, const std::string& path) {
  const std::vector<char> bytes = BuildXclbin(spec);
  std::ofstream file(path, std::ios::binary);
  file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!file) return InternalError("cannot write the xclbin '" + path + "'");
  return Status::Ok();
}

}  // namespace tessera::xrt_backend
