// bench_collectives: the allreduce sweep of collectives/benchmark.h as its own program (the
// same as `tessera bench collectives`), so that mpirun can launch it.
#include "collectives/benchmark.h"

int main(int argc, char** argv) { return tessera::collectives::CollectivesBenchmarkMain(argc, argv); }
