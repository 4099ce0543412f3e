"""``--compile``: the graphs Dynamo captures and Inductor lowers, Inductor's layout decision
for each and its reading, the copies its lowering inserts, side by side with the eager losses."""
