# bench_collectives: allreduce time, algbw and busbw for the p2p and gloo backends (and mpi
# under mpirun), plus the single-stream loopback TCP ceiling. See bench/collectives.sh.
add_executable(bench_collectives ${CMAKE_CURRENT_LIST_DIR}/collectives.cc)
target_link_libraries(bench_collectives PRIVATE tessera_collectives)
tessera_warnings(bench_collectives)
