; repetition_code.s - a three-qubit bit-flip repetition code with a real-time decoder.
;
; Run with:  qlink sim --qubits 5 firmware/repetition_code.s --json repetition_code.json
; (the HOST_CALL handler `decode` is firmware/repetition_code.py, the .py beside this file,
; which qlink sim loads by itself; --model FILE changes the qubits' parameters)
;
; Qubits (channel map of --qubits 5): data qubits 0, 2 and 4, ancillas 1 and 3 between them.
; Drive channel q drives qubit q, drive channel 5 + q is the coupler of qubits q and q + 1
; (5: 0-1, 6: 1-2, 7: 2-3, 8: 3-4), readout channel q reads qubit q. A coupler pulse of the
; gaussian's area is a CZ in the model; amplitude 1.0 of the gaussian on a drive is a pi pulse
; about X, 0.5 a pi/2.
;
; Each shot:
;   1. prepares the logical state: a pulse of amplitude LOGICAL on each data qubit (0.0: |000>,
;      1.0: |111>);
;   2. runs ROUNDS syndrome rounds; in round INJECT_ROUND (counted from 0) an X error (a pi
;      pulse) hits data qubit INJECT_QUBIT before the parity checks;
;   3. measures the three data qubits (readouts 0, 2, 4) and resets them for the next shot
;      (a pi pulse on each that read 1).
;
; A syndrome round: Rx(pi/2) on both ancillas, CZ(0,1) with CZ(2,3), CZ(1,2) with CZ(3,4),
; Rx(-pi/2) on both ancillas: each ancilla ends in |q_left XOR q_right> (a CZ turns the ancilla's
; |+i>-like state into the other one when its data neighbour is 1), and is read into r1 (ancilla
; 1: parity of qubits 0 and 2) and r3 (ancilla 3: parity of qubits 2 and 4). The program calls
; `decode(r5:8, r1:1, r3:1) -> r7` with the round and the two bits (three arguments, a byte
; each: the CALL waits for both measurements); the host's decoder keeps the shot's syndrome history and answers the
; data qubit to correct plus one (0: none). After the CALL the program re-anchors the timeline
; (SYNC) and, in parallel, resets each ancilla that read 1 (a pi pulse) and plays the
; correction (a pi pulse on the data qubit the decoder named).
;
; The JSON's measurements, per shot: for each round the two ancillas (qubit 1, then 3, in one
; cycle), then the three data qubits (0, 2, 4, in one cycle). Its rpc list has one `decode` per
; round, with the argument and result bytes the decoder got and gave.
;
; Counted loops: r4 counts the shots down (LOOP), r5 the rounds up.

; --- the experiment ---------------------------------------------------------------------------
.equ SHOTS, 4                   ; shots in one run
.equ ROUNDS, 3                  ; syndrome rounds per shot
.equ INJECT_ROUND, 1            ; the round (0 .. ROUNDS - 1) whose start gets the X error
.equ INJECT_QUBIT, 2            ; the data qubit (0, 2 or 4) that gets it
.equ LOGICAL, 0.0               ; preparation pulse: 0.0 keeps |000>, 1.0 makes |111>

; --- channels (--qubits 5) --------------------------------------------------------------------
.equ D0, 0                      ; data qubits' drives (and readouts)
.equ D2, 2
.equ D4, 4
.equ A1, 1                      ; ancillas' drives (and readouts)
.equ A3, 3
.equ C01, 5                     ; couplers
.equ C12, 6
.equ C23, 7
.equ C34, 8

; --- timing -----------------------------------------------------------------------------------
.equ PULSE, 64                  ; every pulse: the 64-sample gaussian
.equ WINDOW, 25                 ; readout window, cycles
.equ SLACK, 64                  ; SYNC slack after the CALL: time to queue the pulses

.envelope gauss, gaussian, length=PULSE, sigma=16, amp=1.0

        set r4, SHOTS
shot:   play D0, gauss, amp=LOGICAL             ; the logical state
        play D2, gauss, amp=LOGICAL
        play D4, gauss, amp=LOGICAL
        wait PULSE
        set r5, 0
round:  bne r5, INJECT_ROUND, check
        play INJECT_QUBIT, gauss, amp=1.0       ; the injected X error
        wait PULSE
check:  play A1, gauss, amp=0.5                 ; Rx(pi/2) on the ancillas
        play A3, gauss, amp=0.5
        wait PULSE
        play C01, gauss, amp=1.0                ; CZ(0,1), CZ(2,3)
        play C23, gauss, amp=1.0
        wait PULSE
        play C12, gauss, amp=1.0                ; CZ(1,2), CZ(3,4)
        play C34, gauss, amp=1.0
        wait PULSE
        play A1, gauss, amp=-0.5                ; Rx(-pi/2) on the ancillas
        play A3, gauss, amp=-0.5
        wait PULSE
        acquire A1, r1, window=WINDOW, threshold=0
        acquire A3, r3, window=WINDOW, threshold=0
        wait WINDOW
        call decode(r5:8, r1:1, r3:1) -> r7     ; r7: data qubit to correct + 1, or 0
        sync SLACK
        beq r1, 0, reset3                       ; reset the ancillas that read 1
        play A1, gauss, amp=1.0
reset3: beq r3, 0, correct
        play A3, gauss, amp=1.0
correct: beq r7, 0, next
        beq r7, 1, fix0
        beq r7, 3, fix2
        play D4, gauss, amp=1.0                 ; r7 = 5: correct qubit 4
        jmp next
fix0:   play D0, gauss, amp=1.0
        jmp next
fix2:   play D2, gauss, amp=1.0
next:   wait PULSE
        add r5, r5, 1
        bne r5, ROUNDS, round

        acquire D0, r8, window=WINDOW, threshold=0      ; the data qubits
        acquire D2, r9, window=WINDOW, threshold=0
        acquire D4, r10, window=WINDOW, threshold=0
        wait WINDOW
        add r12, r8, 0                          ; waits for the results
        add r12, r9, 0
        add r12, r10, 0
        sync SLACK
        beq r8, 0, done0                        ; reset the data qubits for the next shot
        play D0, gauss, amp=1.0
done0:  beq r9, 0, done2
        play D2, gauss, amp=1.0
done2:  beq r10, 0, done4
        play D4, gauss, amp=1.0
done4:  wait PULSE
        loop r4, shot
        end
