// QKV_MPI_API marks the symbols of qkv::mpi, the optional context-parallel library (built when MPI
// is found): a DLL on Windows when built shared. QKV_MPI_STATIC: linked statically (set by the
// qkv::mpi target); QKV_MPI_BUILDING: compiling the library itself.
#pragma once

#if defined(QKV_MPI_STATIC)
#define QKV_MPI_API
#elif defined(_WIN32)
#if defined(QKV_MPI_BUILDING)
#define QKV_MPI_API __declspec(dllexport)
#else
#define QKV_MPI_API __declspec(dllimport)
#endif
#else
#define QKV_MPI_API __attribute__((visibility("default")))
#endif
