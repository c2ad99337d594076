// Thread-block clusters for the persistent schedule's cluster mode (engine/schedules/cluster.py; PTX ISA,
// "Cluster of cooperative thread arrays", "mapa", "barrier.cluster").
//
// The blocks of a cluster keep the step GEMMs' operand in their own shared memory. The cell code writes a unit's
// 16-bit value into its own block's copy; after a block barrier the block copies its slice into every other block
// of the cluster (rnn_cluster_share: mapa gives the peer's shared::cluster address of the same offset), and a
// cluster barrier ends every stage: arrive with release semantics after a block's stores, wait with acquire
// semantics before the next stage reads. Every thread of every block of the cluster takes part.
#ifndef RNN_CLUSTER_SYNC_CUH
#define RNN_CLUSTER_SYNC_CUH

// The V (2, 4, 8 or 16 bytes) at shared address `addr` (this block's offset) into block `rank` of the cluster.
template <typename V>
__device__ __forceinline__ void rnn_cluster_put(unsigned addr, unsigned rank, const V& v)
{
    unsigned remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(addr), "r"(rank));
    if constexpr (sizeof(V) == 16)
        asm volatile("st.shared::cluster.v4.u32 [%0], {%1, %2, %3, %4};\n"
                     ::"r"(remote), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
    else if constexpr (sizeof(V) == 8)
        asm volatile("st.shared::cluster.v2.u32 [%0], {%1, %2};\n" ::"r"(remote), "r"(v.x), "r"(v.y) : "memory");
    else if constexpr (sizeof(V) == 4)
        asm volatile("st.shared::cluster.u32 [%0], %1;\n" ::"r"(remote), "r"(v) : "memory");
    else
        asm volatile("st.shared::cluster.u16 [%0], %1;\n" ::"r"(remote), "h"(v) : "memory");
}

// The V (2, 4, 8 or 16 bytes) at shared address `addr` (this block's offset) of block `rank` of the cluster.
template <typename V>
__device__ __forceinline__ V rnn_cluster_get(unsigned addr, unsigned rank)
{
    unsigned remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(addr), "r"(rank));
    V v;
    if constexpr (sizeof(V) == 16)
        asm volatile("ld.shared::cluster.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(remote) : "memory");
    else if constexpr (sizeof(V) == 8)
        asm volatile("ld.shared::cluster.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(remote) : "memory");
    else if constexpr (sizeof(V) == 4)
        asm volatile("ld.shared::cluster.u32 %0, [%1];\n" : "=r"(v) : "r"(remote) : "memory");
    else
        asm volatile("ld.shared::cluster.u16 %0, [%1];\n" : "=h"(v) : "r"(remote) : "memory");
    return v;
}

// This block's slice of a local copy, `rows` rows of `row_bytes` bytes from byte `col_bytes` of each row (rows
// `stride_bytes` apart, from `local`), copied into the same place in every other block of a cluster of CS blocks,
// V (2, 4, 8 or 16 bytes: what divides the slice's offset and width) at a time: a few wide remote stores a thread
// instead of one 16-bit store per unit and block (one thread's remote stores are the step's latency).
template <int CS, typename V>
__device__ __forceinline__ void rnn_cluster_share(const unsigned short* local, int rows, int stride_bytes, int col_bytes,
                                                  int row_bytes)
{
    unsigned me;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(me));
    const unsigned base = (unsigned)__cvta_generic_to_shared(local);
    const int per_row = row_bytes / (int)sizeof(V), n = rows * per_row;
    for (int i = threadIdx.x; i < n * (CS - 1); i += blockDim.x) {
        const int k = i / n, e = i - k * n, row = e / per_row;
        const int at = row * stride_bytes + col_bytes + (e - row * per_row) * (int)sizeof(V);
        rnn_cluster_put<V>(base + at, (unsigned)k + ((unsigned)k >= me),
                           *reinterpret_cast<const V*>(reinterpret_cast<const char*>(local) + at));
    }
}

// Every block of the cluster has finished its stores (release), and this thread sees them (acquire).
__device__ __forceinline__ void rnn_cluster_sync()
{
    asm volatile("barrier.cluster.arrive.release;\n" ::: "memory");
    asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory");
}

// The two halves, for a stage that has stores no other block reads (its states, the output sequence): the arrive's
// release waits for every store before it to be performed (a memory barrier: ~0.8 us a step with the step's
// global stores in flight, ncu on an H200), so those stores go after the arrive and before the wait.
__device__ __forceinline__ void rnn_cluster_arrive()
{
    asm volatile("barrier.cluster.arrive.release;\n" ::: "memory");
}
__device__ __forceinline__ void rnn_cluster_wait()
{
    asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory");
}

#endif
