// A stand-in CUDA driver: a libcuda.so.1 with none of the driver's functions. First on
// LD_LIBRARY_PATH, it makes a process behave as on a machine with a driver and no usable GPU:
// Tessera loads its CUDA module, and the CUDA runtime says why no device opens.
extern "C" __attribute__((visibility("default"))) int tessera_stand_in_cuda_driver() { return 1; }
