# minor faults and CPU ticks of every VLLM worker over 10 s
declare -A F0 C0
for p in $(pgrep -f "VLLM::Worker"); do s=$(cut -d' ' -f10,14,15 /proc/$p/stat 2>/dev/null); F0[$p]=$(echo $s|cut -d' ' -f1); C0[$p]=$(( $(echo $s|cut -d' ' -f2) + $(echo $s|cut -d' ' -f3) )); done
sleep 10
for p in "${!F0[@]}"; do s=$(cut -d' ' -f10,14,15 /proc/$p/stat 2>/dev/null); f=$(echo $s|cut -d' ' -f1); c=$(( $(echo $s|cut -d' ' -f2) + $(echo $s|cut -d' ' -f3) )); api=$(ps -o ppid= -p $(ps -o ppid= -p $p)); echo "worker $p api $api minflt/10s $((f-F0[$p])) cpu_ticks $((c-C0[$p]))"; done
