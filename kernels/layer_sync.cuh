// Per-layer arrival counters for the persistent kernel (TileConfig(sync="layer"), engine/codegen/wavefront.py).
//
// Instead of a grid-wide barrier after every stage of a wavefront step, every block counts its finished stages
// on its layer's counter, and a block waits only for what it reads: the previous stage of its own layer (all
// blocks of the layer: the recurrent state it multiplies), and before the first stage of step t the end of
// step t of the layer below (its output row block t). A layer runs ahead of the layers above it instead of
// idling at a barrier while they finish (at `blogB` layer 0's blocks, with K = 320 against 512 above, waited
// 4.7 us a step in grid.sync).
//
// Why a sum suffices: a block starts its stage instance n (n = t * S + i) only once its layer's counter reaches
// BLOCKS_PER_LAYER * n. By induction no block is ever more than one instance ahead of the slowest: to finish
// instance n it saw the sum of all blocks' counts reach BLOCKS_PER_LAYER * n, which, with every count at most
// one above the smallest, needs the smallest at n already. So the counter at BLOCKS_PER_LAYER * n means every
// block of the layer has finished instances 0 .. n - 1; at BLOCKS_PER_LAYER * S * (t + 1), all of step t.
//
// Ordering, the pattern of the CUDA memory model for a flag: the writers' stores, a block barrier, then one
// thread's fence and relaxed atomic add at GPU scope; the waiter's one thread spins on an acquire load at GPU
// scope, then a block barrier, after which every thread of the block reads what the writers stored. The
// counters are zeroed before every launch (engine/schedules/persistent.py). Every block of the grid is
// resident (a cooperative launch), so a spinning block never waits for one that cannot run.
#ifndef RNN_LAYER_SYNC_CUH
#define RNN_LAYER_SYNC_CUH

__device__ __forceinline__ unsigned rnn_load_acquire(const unsigned* p)
{
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// Thread 0 waits until *counter >= target (nothing when target is 0).
__device__ __forceinline__ void rnn_wait_for(const unsigned* counter, unsigned target)
{
    if (threadIdx.x == 0 && target > 0)
        while (rnn_load_acquire(counter) < target) {
        }
}

// The block has finished a stage: after every thread's stores, one count on the layer's counter.
__device__ __forceinline__ void rnn_arrive(unsigned* counter)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(counter, 1u);
    }
}

#endif
