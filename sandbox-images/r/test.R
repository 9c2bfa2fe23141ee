x <- c(1, 2, 3)
stopifnot(sum(x) == 6, mean(x) == 2)
cat("OK\n")
