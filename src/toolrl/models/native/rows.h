/* ROWS_n(F) expands F(0) .. F(n - 1): a micro-kernel's rows unrolled, its accumulators named variables rather than an
   array (GCC keeps an array's registers mirrored to the stack: a store per multiply-add, 2.5x slower measured).
   Shared by small_gemm.c and flash.c. */

#ifndef TOOLRL_ROWS_H
#define TOOLRL_ROWS_H

#define ROWS_1(F) F(0)
#define ROWS_2(F) ROWS_1(F) F(1)
#define ROWS_3(F) ROWS_2(F) F(2)
#define ROWS_4(F) ROWS_3(F) F(3)
#define ROWS_5(F) ROWS_4(F) F(4)
#define ROWS_6(F) ROWS_5(F) F(5)
#define ROWS_7(F) ROWS_6(F) F(6)
#define ROWS_8(F) ROWS_7(F) F(7)
#define ROWS_9(F) ROWS_8(F) F(8)
#define ROWS_10(F) ROWS_9(F) F(9)
#define ROWS_11(F) ROWS_10(F) F(10)
#define ROWS_12(F) ROWS_11(F) F(11)

#endif
